"""One place that turns a --spec value into a proposer for a target model."""

from __future__ import annotations

import copy

import torch

from speclm.config import HEAD_OPTIONS, SpecConfig, WeightFormat
from speclm.models.builder import GPU_FORMATS, build_model
from speclm.models.checkpoint import ModelLoadError
from speclm.models.llama import LlamaModel
from speclm.models.loader import load_checkpoint
from speclm.models.weight_formats import convert_linear_layers
from speclm.speculative.draft_model import DraftModelProposer, DraftTreeProposer, load_token_map
from speclm.speculative.eagle import EagleProposer
from speclm.speculative.heads import load_head
from speclm.speculative.hybrid import HybridProposer
from speclm.speculative.lookahead import LookaheadProposer
from speclm.speculative.medusa import MedusaProposer
from speclm.speculative.ngram import NgramProposer
from speclm.speculative.proposer import Proposer
from speclm.tokenizer import load_tokenizer


class ProposerFactory:
    """Proposers for one target model. The first request for a method builds it (loading a draft
    model or head once); every call returns a fresh() copy for one sequence."""

    def __init__(self, target: LlamaModel, weights: WeightFormat | str | None = None) -> None:
        self.target = target
        self.weights = WeightFormat.parse(weights)
        self._built: dict[str, Proposer] = {}  # shared with every for_another_engine() factory
        self._templates: dict[str, Proposer] = {}  # this engine's

    def __call__(self, spec: SpecConfig) -> Proposer:
        if spec.label not in self._templates:
            if spec.label not in self._built:
                self._built[spec.label] = self._build(spec)
            self._templates[spec.label] = self._built[spec.label].for_another_engine()
        return self._templates[spec.label].fresh()

    def for_another_engine(self) -> ProposerFactory:
        """A factory for another engine (LLM.with_spec): the proposers loaded once for both, the state a
        proposer keeps across sequences (a draft's prompt memo) of its own, as an engine's prefix cache is
        its own. So what one engine's requests left there does not speed up another's (spec_bench runs
        each method in an engine of its own, the same prompts one after another)."""
        other = copy.copy(self)
        other._templates = {}
        return other

    def _build(self, spec: SpecConfig) -> Proposer:
        if spec.method == "ngram":
            return NgramProposer(max_n=int(spec.argument) if spec.argument else 4)
        if spec.method == "lookahead":
            return LookaheadProposer(*spec.lookahead_shape())
        if spec.method == "layerskip":
            n, layers = int(spec.argument), self.target.config.num_layers
            if not 1 <= n < layers:
                raise ValueError(f"layerskip:{n} needs 1 <= N < {layers} (the model's layers)")
            proposer = DraftModelProposer(self.target, num_layers=n, name=spec.label)
            proposer.calibrate()  # (its catch-ups read the prompt through the first n layers: priced too)
            return proposer
        if spec.method in HEAD_OPTIONS:
            return self._head_proposer(spec)
        return self._draft_proposer(spec)

    def _draft_proposer(self, spec: SpecConfig) -> Proposer:
        draft = build_draft_proposer(spec, self.target.config.vocab_size, self.target.device)
        if spec.draft_path_and_options()[1]["lookup"]:  # prompt lookup where it pays, the draft elsewhere
            return HybridProposer(draft, name=spec.label)
        return draft

    def _head_proposer(self, spec: SpecConfig) -> Proposer:
        path, options = spec.head_path_and_options()
        head = load_head(path, self.target.config)
        if head.kind != spec.method:
            raise ValueError(f"{path} holds a {head.kind} head, not a {spec.method} head; use {head.kind}:{path}")
        convert_linear_layers(head, self.weights)  # the head's layers run in the target's weight format
        if spec.method == "medusa":
            return MedusaProposer(self.target, head, name=spec.label, **options)
        return EagleProposer(self.target, head, name=spec.label, **options)


def build_draft_proposer(
    spec: SpecConfig, target_vocab_size: int | None, device: torch.device | None = None
) -> DraftModelProposer:
    """The proposer of a draft:PATH spec (its model loaded), for a target of `target_vocab_size` tokens
    (None: checked elsewhere, as a deployment's target service does). The in-process factory and a
    deployment's draft service (speclm/deploy/) both build it here. The `lookup` option is the factory's:
    this is the draft model alone."""
    path, options = spec.draft_path_and_options()
    checkpoint = load_checkpoint(path)
    config = checkpoint.config
    vocab = config.vocab_size
    if target_vocab_size is not None and vocab != target_vocab_size:
        raise ValueError(
            f"draft model {path} has vocabulary {vocab}, the target {target_vocab_size}; they must share a tokenizer"
        )
    token_map = load_token_map(path, vocab)
    if token_map is None and 0 < options["vocab"] < vocab:
        token_map = frequent_tokens(options["vocab"], vocab, config.eos_token_ids + added_token_ids(path))
    if device is not None and device.type == "cuda":  # beside a GPU target: dense on the GPU (q4_0 is CPU code)
        weights = options["weights"] if options["weights"] in GPU_FORMATS else "auto"
        draft = build_model(checkpoint, weights=weights, device=device)
    else:
        draft = build_model(checkpoint, weights=options["weights"])
    del checkpoint
    chain = {"window": options["window"], "sinks": options["sinks"], "stop": options["stop"]}
    if options["branch"]:
        proposer = DraftTreeProposer(draft, options["branch"], name=spec.label, token_map=token_map, **chain)
    else:
        proposer = DraftModelProposer(draft, name=spec.label, token_map=token_map, **chain)
    proposer.calibrate()
    return proposer


def added_token_ids(path: str) -> list[int]:
    """The draft file's added tokens (control tokens, chat and tool-call markers), or [] when it has no
    tokenizer of its own. They have the highest ids of a byte-level BPE vocabulary, so a map of its
    lowest ids leaves them out, yet a chat model writes them: without them a draft can never propose the
    end of a turn's markers, a tool call's tags or a fill-in-the-middle answer's tokens."""
    try:
        return load_tokenizer(path).added_token_ids
    except ModelLoadError:  # (a checkpoint whose tokenizer is passed separately, as llama2.c's)
        return []


def frequent_tokens(count: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The `count` lowest token ids plus `always` (end-of-turn and added tokens): byte-level BPE
    vocabularies number tokens in the order their merges were learned, so low ids are the frequent ones.
    A draft over them never proposes the rest; the target still verifies over the whole vocabulary."""
    ids = torch.arange(count)
    extra = torch.tensor(sorted({t for t in always if t >= count and t < vocab_size}), dtype=torch.long)
    return torch.cat([ids, extra])
