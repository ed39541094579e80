"""Peer engines timed on the same model, prompts and greedy token count: Hugging Face transformers."""
from __future__ import annotations

import time


def transformers_greedy(model_path: str, prompt_ids: list[list[int]], max_tokens: int, prompt_lookup: int = 0) -> list[dict]:
    """Greedy `generate` from transformers on the same GGUF / HF directory (fp32).
    prompt_lookup > 0 enables transformers' prompt-lookup speculative decoding."""
    import os

    import torch
    from transformers import AutoModelForCausalLM

    if os.path.isdir(model_path):
        model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(model_path) or ".", gguf_file=os.path.basename(model_path), torch_dtype=torch.float32
        )
    model.eval()
    extra = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
    results = []
    with torch.inference_mode():
        model.generate(torch.tensor([prompt_ids[0]]), max_new_tokens=4, do_sample=False)  # warm-up
        for ids in prompt_ids:
            inp = torch.tensor([ids])
            t0 = time.perf_counter()
            out = model.generate(
                inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                do_sample=False, pad_token_id=0, **extra,
            )
            seconds = time.perf_counter() - t0
            new = out[0, len(ids):].tolist()
            results.append({"tokens": len(new), "seconds": seconds, "token_ids": new})
    return results
