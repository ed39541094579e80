"""The Python API: LLM(model=...).generate(prompts, SamplingParams(...))."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from speclm.config import HEAD_OPTIONS, SpecConfig
from speclm.engine.llm_engine import LLMEngine, StreamChunk
from speclm.engine.model_runner import ModelRunner
from speclm.engine.request import Request, RequestOutput
from speclm.models.checkpoint import ModelLoadError, build_model
from speclm.models.llama import LlamaModel
from speclm.models.loader import load_checkpoint
from speclm.models.quant_linear import WeightFormat, convert_linear_layers
from speclm.sampling_params import SamplingParams
from speclm.spec.draft_model import DraftModelProposer, load_token_map
from speclm.spec.eagle import EagleProposer
from speclm.spec.heads import load_head
from speclm.spec.medusa import MedusaProposer
from speclm.spec.ngram import NgramProposer
from speclm.spec.proposer import Proposer
from speclm.tokenizer import Tokenizer, load_tokenizer

Prompt = str | list[int]


class LLM:
    """A loaded model ready to generate, optionally with speculative decoding.

    model: None (the default SmolLM2-135M-Instruct), a .gguf file, a Hugging Face model directory,
    a llama2.c .bin (with tokenizer=...), or a hub id (needs a network).
    spec: None, or 'ngram', 'layerskip:N', 'draft:PATH', 'medusa:PATH', 'eagle:PATH' (see
    speclm.config.SPEC_METHODS_HELP for head options); num_speculative_tokens is K (the maximum
    when adaptive; the node budget of medusa/eagle trees). weights: the runtime format of the linear layers, fp32 (default) | bf16 | int8 |
    int4 | int4:GROUP (see speclm.models.quant_linear).
    """

    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        spec: str | SpecConfig | None = None,
        num_speculative_tokens: int = 4,
        adaptive: bool = True,
        threads: int | None = None,
        weights: str | None = None,
    ) -> None:
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise ValueError(f"threads must be a positive integer, got {threads!r}")
            torch.set_num_threads(threads)
        self.weights = WeightFormat.parse(weights)  # a bad value fails before the slow load
        checkpoint = load_checkpoint(model)
        self.model_path = checkpoint.source
        self.model: LlamaModel = build_model(checkpoint, weights=self.weights)
        del checkpoint  # drop the file's reader (its parsed metadata) before loading the tokenizer
        self.tokenizer: Tokenizer = load_tokenizer(self.model_path, tokenizer)
        if self.tokenizer.vocab_size > self.model.config.vocab_size:
            raise ModelLoadError(
                f"tokenizer has {self.tokenizer.vocab_size} tokens but the model only {self.model.config.vocab_size}"
            )
        self._ids = itertools.count()
        self._set_spec(SpecConfig.parse(spec, num_speculative_tokens, adaptive) if isinstance(spec, str) else spec)

    def _set_spec(self, spec: SpecConfig | None) -> None:
        self.spec = spec
        proposer = self._make_proposer(spec) if spec else None
        self.engine = LLMEngine(
            ModelRunner(self.model),
            self.tokenizer,
            proposer,
            spec.num_speculative_tokens if spec else 0,
            spec.adaptive if spec else False,
        )

    def with_spec(self, spec: str | SpecConfig | None, num_speculative_tokens: int = 4, adaptive: bool = True) -> "LLM":
        """A new LLM sharing this one's weights and tokenizer, with another speculative method."""
        other = object.__new__(LLM)
        other.model_path, other.model, other.tokenizer = self.model_path, self.model, self.tokenizer
        other.weights = self.weights
        other._ids = itertools.count()
        other._set_spec(SpecConfig.parse(spec, num_speculative_tokens, adaptive) if isinstance(spec, str) else spec)
        return other

    def new_proposer(self, spec: SpecConfig) -> Proposer:
        """A fresh proposer (own per-sequence state) for the batched engine; draft models and heads load once."""
        if spec.method == "ngram":
            return self._make_proposer(spec)
        shared = getattr(self, "_draft_proposers", {})
        self._draft_proposers = shared
        if spec.label not in shared:
            shared[spec.label] = self._make_proposer(spec)
        template = shared[spec.label]
        if spec.method in HEAD_OPTIONS:
            return template.fresh()
        return DraftModelProposer(template.model, num_layers=template.num_layers, name=template.name,
                                  token_map=template.token_map)

    def _make_proposer(self, spec: SpecConfig) -> Proposer:
        if spec.method == "ngram":
            return NgramProposer(max_n=int(spec.argument) if spec.argument else 4)
        if spec.method == "layerskip":
            n = int(spec.argument)
            if not 1 <= n < self.model.config.num_layers:
                raise ValueError(f"layerskip:{n} needs 1 <= N < {self.model.config.num_layers} (the model's layers)")
            return DraftModelProposer(self.model, num_layers=n, name=spec.label)
        if spec.method in HEAD_OPTIONS:
            path, options = spec.head_path_and_options()
            head = load_head(path, self.model.config)
            if head.kind != spec.method:
                raise ValueError(f"{path} holds a {head.kind} head, not a {spec.method} head; use {head.kind}:{path}")
            # The head's layers run in the target's weight format (an fp32 head layer costs ~2 ms a row here).
            convert_linear_layers(head, self.weights)
            if spec.method == "medusa":
                return MedusaProposer(self.model, head, name=spec.label, **options)
            return EagleProposer(self.model, head, name=spec.label, **options)
        draft = build_model(load_checkpoint(spec.argument), weights=self.weights)
        if draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(
                f"draft model {spec.argument} has vocabulary {draft.config.vocab_size}, "
                f"the target {self.model.config.vocab_size}; they must share a tokenizer"
            )
        return DraftModelProposer(draft, name=spec.label, token_map=load_token_map(spec.argument, draft.config.vocab_size))

    # -- prompts -------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def _request(self, prompt_ids: list[int], params: SamplingParams | None) -> Request:
        return Request(str(next(self._ids)), prompt_ids, params or SamplingParams())

    # -- generation ----------------------------------------------------------------------
    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | None = None) -> list[RequestOutput]:
        """Complete each prompt (text or token ids); one RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return [
            self.engine.generate(self._request(self.encode(p), params), p if isinstance(p, str) else None)
            for p in prompts
        ]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Yield text chunks as they are generated; the last chunk's `output` holds the result."""
        return self.engine.stream(self._request(self.encode(prompt), params), prompt if isinstance(prompt, str) else None)

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        """Answer a conversation ([{'role': 'user', 'content': ...}, ...]) with the chat template."""
        return self.engine.generate(self._request(self.tokenizer.encode_chat(messages), params))

    def stream_chat(self, messages: list[dict], params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        return self.engine.stream(self._request(self.tokenizer.encode_chat(messages), params))
