"""Peer engines timed on the same model, prompts and greedy token count: transformers and llama.cpp.

Each peer is a small object with `generate(prompt_ids, max_tokens) -> (new token ids, seconds)`,
so `speclm bench --compare` can interleave them with speclm's own methods prompt by prompt.
"""

from __future__ import annotations

import functools
import os
import time


@functools.cache  # the peers of one run share their models (a GGUF loads in minutes through transformers)
def transformers_model(model_path: str):
    """A transformers causal LM in fp32 from an HF directory or a GGUF file (dequantized)."""
    import torch
    from transformers import AutoModelForCausalLM

    if os.path.isdir(model_path):
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model_path) or ".", gguf_file=os.path.basename(model_path), dtype=torch.float32
    ).eval()


class _FirstToken:
    """A transformers streamer that notes when the first generated tokens arrive (its first put() is
    the prompt)."""

    def __init__(self) -> None:
        self.puts, self.first_at = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first_at = time.perf_counter()

    def end(self) -> None:
        pass


class TransformersPeer:
    """Greedy `generate` from transformers (fp32) on the same GGUF / HF directory; prompt_lookup > 0
    turns on its prompt-lookup speculative decoding (`prompt_lookup_num_tokens`), an `assistant` model
    (a draft's path, or a loaded model; `assistant_tokens` its starting draft length) its assisted generation."""

    def __init__(self, model_path: str, prompt_lookup: int = 0, model=None, assistant=None, assistant_tokens=5) -> None:
        self.model = model if model is not None else transformers_model(model_path)
        self.prompt_lookup = prompt_lookup
        self.assistant = transformers_model(assistant) if isinstance(assistant, str) else assistant
        if self.assistant is not None:
            self.assistant.generation_config.num_assistant_tokens = assistant_tokens
        self.name = "transformers" + (f"+prompt_lookup:{prompt_lookup}" if prompt_lookup else "")
        self.name += "-assisted" if assistant is not None else ""
        self.prefill_seconds = 0.0  # of the last generate(): prompt to its first new token

    def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[list[int], float]:
        import torch

        extra = {"prompt_lookup_num_tokens": self.prompt_lookup} if self.prompt_lookup else {}
        if self.assistant is not None:
            extra["assistant_model"] = self.assistant
        inp = torch.tensor([prompt_ids])
        streamer = _FirstToken()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(
                inp,
                attention_mask=torch.ones_like(inp),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
                streamer=streamer,
                **extra,
            )
            seconds = time.perf_counter() - t0
        self.prefill_seconds = (streamer.first_at or t0 + seconds) - t0
        return out[0, len(prompt_ids) :].tolist(), seconds


class TransformersBenchPeer:
    """A TransformersPeer in `speclm bench`'s peer protocol (see speclm.bench.llama_cli.LlamaCliPeer):
    the prompt's ids in, a PeerRun out, its text decoded with speclm's tokenizer."""

    family = "transformers"  # its greedy text is checked against the first peer of its family

    def __init__(self, peer: TransformersPeer, decode) -> None:
        self.peer, self.name, self.decode = peer, peer.name, decode

    def generate(self, prompt_ids: list[int], prompt_text: str, max_tokens: int):
        from speclm.bench.llama_cli import PeerRun

        new, seconds = self.peer.generate(prompt_ids, max_tokens)
        prefill = self.peer.prefill_seconds
        return PeerRun(self.decode(new), len(new), prefill, seconds - prefill)


class LlamaCppPeer:
    """llama.cpp through llama-cpp-python (an optional benchmark extra): greedy, EOS ignored,
    optionally with its prompt-lookup draft (LlamaPromptLookupDecoding)."""

    def __init__(self, model_path: str, threads: int, prompt_lookup: int = 0, n_ctx: int = 2048) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError as e:
            raise ValueError("peer llama.cpp needs `pip install llama-cpp-python` (speclm[peers])") from e
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
