"""Peer engines timed on the same model, prompts and greedy token count: transformers and llama.cpp.

Each peer is a small object with `generate(prompt_ids, max_tokens) -> (new token ids, seconds)`,
so `speclm bench --compare` can interleave them with speclm's own methods prompt by prompt.
"""

from __future__ import annotations

import os
import time


class TransformersPeer:
    """Greedy `generate` from transformers (fp32) on the same GGUF / HF directory; prompt_lookup > 0
    turns on its prompt-lookup speculative decoding (`prompt_lookup_num_tokens`)."""

    def __init__(self, model_path: str, prompt_lookup: int = 0, model=None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if model is None:
            if os.path.isdir(model_path):
                model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    os.path.dirname(model_path) or ".", gguf_file=os.path.basename(model_path), dtype=torch.float32
                )
        self.model = model.eval()
        self.prompt_lookup = prompt_lookup
        self.name = "transformers" + (f"+prompt_lookup:{prompt_lookup}" if prompt_lookup else "")

    def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float]:
        import torch

        extra = {"prompt_lookup_num_tokens": self.prompt_lookup} if self.prompt_lookup else {}
        inp = torch.tensor([prompt_ids])
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(
                inp,
                attention_mask=torch.ones_like(inp),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
                **extra,
            )
            seconds = time.perf_counter() - t0
        return out[0, len(prompt_ids) :].tolist(), seconds


class LlamaCppPeer:
    """llama.cpp through llama-cpp-python (an optional benchmark extra): greedy, EOS ignored,
    optionally with its prompt-lookup draft (LlamaPromptLookupDecoding)."""

    def __init__(self, model_path: str, threads: int, prompt_lookup: int = 0, n_ctx: int = 2048) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError as e:
            raise ValueError("peer llama.cpp needs `pip install llama-cpp-python` (speclm[bench])") from e
        draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup) if prompt_lookup else None
        self.llama = Llama(
            model_path,
            n_threads=threads,
            n_threads_batch=threads,
            n_ctx=n_ctx,
            logits_all=draft is not None,
            draft_model=draft,
            verbose=False,
        )
        self.name = "llama.cpp" + (f"+prompt_lookup:{prompt_lookup}" if prompt_lookup else "")

    def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float]:
        self.llama.reset()  # no prompt-prefix reuse from the previous call: every engine prefills
        tokens = []
        t0 = time.perf_counter()
        for token in self.llama.generate(prompt_ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            tokens.append(int(token))
            if len(tokens) == max_tokens:
                break
        return tokens, time.perf_counter() - t0


def transformers_greedy(
    model_path: str, prompt_ids: list[list[int]], max_tokens: int, prompt_lookup: int = 0
) -> list[dict]:
    """Greedy `generate` from transformers on each prompt (one warm-up first): tokens, seconds, ids."""
    peer = TransformersPeer(model_path, prompt_lookup)
    peer.generate(prompt_ids[0], 4)  # warm-up
    results = []
    for ids in prompt_ids:
        new, seconds = peer.generate(ids, max_tokens)
        results.append({"tokens": len(new), "seconds": seconds, "token_ids": new})
    return results
