"""speclm as a worker process for the peer benchmarks (the protocol is in benchmarks/gguf_peers/llama_worker.py).

python benchmarks/gguf_peers/speclm_worker.py MODEL THREADS WEIGHTS [SPEC]
"""

from __future__ import annotations

import sys
import time

from llama_worker import serve  # its neighbour in benchmarks/gguf_peers/


class SpeclmEngine:
    def __init__(self, model: str, threads: int, weights: str, spec: str | None = None) -> None:
        from speclm.config import CacheConfig
        from speclm.llm import LLM

        # no prefix caching: every call prefills, as the peers do
        self.llm = LLM(
            model, weights=weights, threads=threads, spec=spec, cache=CacheConfig(enable_prefix_caching=False)
        )

    def generate(self, ids: list[int], max_tokens: int) -> tuple[list[int], float, float]:
        from speclm.sampling_params import SamplingParams

        tokens, first = [], 0.0
        t0 = time.perf_counter()
        for chunk in self.llm.stream(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True)):
            if chunk.token_ids and not tokens:
                first = time.time()
            tokens += chunk.token_ids
        return tokens, time.perf_counter() - t0, first

    def logits(self, ids: list[int], then: list[int]) -> list[float]:
        """The engine's rows do not depend on what they are batched with, so one pass over everything after
        the first token equals decoding `then` a token at a time. The first token goes alone: a pass from
        slot 0 over several rows would run one SDPA call, not the engine's attention."""
        import torch

        from speclm.models.attention import AttentionMetadata

        model, ids = self.llm.model, ids + then
        n = len(ids)
        cache = model.new_cache(n)
        model(torch.tensor(ids[:1]), torch.arange(1), cache, AttentionMetadata(0, 1))
        hidden = model(torch.tensor(ids[1:]), torch.arange(1, n), cache, AttentionMetadata(1, n - 1))
        return model.compute_logits(hidden[-1:])[0].tolist()


if __name__ == "__main__":
    serve(SpeclmEngine(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None))
