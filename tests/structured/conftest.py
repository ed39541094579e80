"""Tokenizers for the grammar tests: the default model's (SmolLM2, 49k byte-level BPE) and stories260K's
(512-piece SentencePiece with byte fallback); each GrammarVocab is built once per session."""

from __future__ import annotations

import pytest

from speclm.models.loader import default_model_path
from speclm.structured.matcher import GrammarVocab
from speclm.tokenizer import load_tokenizer
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

PADDED_VOCAB = 49216  # the model's logits may have more rows than the tokenizer has tokens


@pytest.fixture(scope="session")
def smol_tokenizer():
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="session")
def smol_vocab(smol_tokenizer):
    return GrammarVocab.of(smol_tokenizer, PADDED_VOCAB)


@pytest.fixture(scope="session")
def stories_tokenizer():
    return load_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)


@pytest.fixture(scope="session")
def stories_vocab(stories_tokenizer):
    return GrammarVocab.of(stories_tokenizer)


@pytest.fixture(autouse=True)
def _tests_here_use_one_thread(one_thread):
    yield
