"""Test harness helpers: an engine around a given proposer object, and reference passes over a plain
contiguous cache (what a model computes for a sequence, outside the engine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

from speclm.config import CacheConfig, SpecConfig
from speclm.engine.engine import Engine
from speclm.engine.request import Request, RequestOutput
from speclm.models.attention import AttentionMetadata


def engine_with_proposer(llm, proposer, k: int, adaptive: bool = False, config: CacheConfig | None = None) -> Engine:
    """An engine over llm's weights whose speculating sequences all use `proposer` (one request at a
    time) with K = k; the method in its SpecConfig is only a carrier for K."""
    spec = SpecConfig("ngram", None, k, adaptive)
    return Engine(llm.runner, llm.tokenizer, config or CacheConfig(), spec, make_proposer=lambda _: proposer)


def generate_with_proposer(
    llm, proposer, prompt_ids: list[int], params, k: int, adaptive: bool = False, engine: Engine | None = None
) -> RequestOutput:
    engine = engine or engine_with_proposer(llm, proposer, k, adaptive)
    return engine.generate([llm._request(prompt_ids, params)])[0][0]


def generate_one(engine: Engine, request: Request) -> RequestOutput:
    """One request through an engine, alone."""
    return engine.generate([request])[0][0]


class ContiguousPass:
    """One sequence's forward passes over a contiguous KV cache of `capacity` tokens."""

    def __init__(self, model, capacity: int) -> None:
        self.model, self.cache = model, model.new_cache(capacity)

    def hidden(self, tokens: list[int], start: int) -> torch.Tensor:  # [n, hidden]
        n = len(tokens)
        return self.model(torch.tensor(tokens), torch.arange(start, start + n), self.cache, AttentionMetadata(start, n))

    def logits(self, tokens: list[int], start: int) -> torch.Tensor:  # [n, vocab]
        return self.model.compute_logits(self.hidden(tokens, start))


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME/NAME.py as a module: the benchmark scripts live outside the package (speclm imports
    none of them), so a test of one loads it by its path, as `python benchmarks/NAME/NAME.py` would run it."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / name / f"{name}.py"
    module_name = f"benchmark_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]
