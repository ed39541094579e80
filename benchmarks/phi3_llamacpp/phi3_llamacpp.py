"""Does llama.cpp read speclm's phi3 GGUF export as the model it is? Tiny random Phi-3.5-mini-like and
Phi-4-mini-like checkpoints (LongRoPE past the original context, partial rotary for Phi-4-mini, tied and
untied heads), exported by speclm (F32, with an o200k-split tokenizer, GGUF pre gpt-4o); greedy tokens from
transformers (the checkpoint), speclm (the GGUF) and llama-server (the GGUF, prompt given as token ids).

Run from the repository root: python benchmarks/phi3_llamacpp/phi3_llamacpp.py [--llama-bin DIR]
It needs transformers (the `bench` extra) and llama.cpp's llama-server; it writes phi3_llamacpp.json and .md
beside itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

HERE = Path(__file__).parent
DEFAULT_BIN = "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
SPECIAL = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=256, original_max_position_embeddings=8, rms_norm_eps=1e-5, pad_token_id=None,
)  # fmt: skip
CASES = {
    "phi3.5-mini-like (untied, full rotary)": dict(rotary=16, partial_rotary_factor=1.0),
    "phi4-mini-like (tied, rotary 12 of 16)": dict(rotary=12, partial_rotary_factor=0.75, tie_word_embeddings=True),
}
PROMPT_LEN, NEW_TOKENS = 13, 32
SEEDS = (0, 1, 2)
# (original context 8 < the 13-token prompt: transformers, which picks LongRoPE's factors by the sequence's
# length, takes the long ones from the first step, as speclm and llama.cpp do for a 256-token context)


def tokenizer_dir(directory: Path) -> None:
    """A byte-level BPE behind o200k's split (Phi-4-mini's kind) trained on this file."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from speclm.tokenizer import _GPT4O_SPLIT

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_GPT4O_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator([open(__file__).read()] * 2, trainer)
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": False}
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config | {"tokenizer_class": "PreTrainedTokenizerFast"})
    )


def tiny_phi3(directory: Path, vocab: int, eos: int, seed: int, rotary: int, **overrides):
    import transformers

    torch.manual_seed(seed)
    half = rotary // 2
    rope = {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(half)],
        "long_factor": [1.5 + 0.7 * i for i in range(half)],
    }
    config = transformers.Phi3Config(
        vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, rope_scaling=rope, **(TINY | overrides)
    )
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    model.eval().save_pretrained(directory)
    return model


def transformers_greedy(model, prompt: list[int]) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_greedy(binary: str, gguf: str, prompt: list[int]) -> list[int]:
    port = free_port()
    # (fp32 KV cache: llama.cpp's default f16 one rounds the keys and values of a model whose activations are large)
    cmd = [binary, "-m", gguf, "-c", "256", "-t", "1", "--port", str(port), "--no-warmup", "-np", "1"]
    cmd += ["-ctk", "f32", "-ctv", "f32"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if json.load(r).get("status") == "ok":
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server did not start: {server.stderr.read()[-2000:]}") from None
                time.sleep(0.3)
        body = {
            "prompt": prompt, "n_predict": NEW_TOKENS, "temperature": 0, "top_k": 1, "samplers": ["top_k"],
            "cache_prompt": False, "return_tokens": True, "ignore_eos": True,
        }  # fmt: skip
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as r:
            return json.load(r)["tokens"]
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", default=DEFAULT_BIN)
    args = parser.parse_args()
    from speclm import LLM, SamplingParams
    from speclm.compress.gguf_export import export_gguf
    from speclm.models.loader import load_checkpoint
    from speclm.tokenizer import load_tokenizer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer_dir(root / "tok")
        tokenizer = load_tokenizer(str(root / "tok"))
        eos = tokenizer.token_to_id("<|endoftext|>")
        prompt = tokenizer.encode("def greedy(model, prompt): return model(prompt) " * 4)[:PROMPT_LEN]
        for (name, case), seed in ((c, s) for c in CASES.items() for s in SEEDS):
            directory = root / f"{name.split()[0]}-{seed}"
            model = tiny_phi3(directory, tokenizer.vocab_size, eos, seed, **case)
            gguf = str(directory / "model.gguf")
            export_gguf(load_checkpoint(str(directory)), tokenizer, gguf, "F32")
            expected = transformers_greedy(model, prompt)
            params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
            ours = LLM(gguf, weights="fp32", threads=1).generate([prompt], params)[0].token_ids
            theirs = llama_server_greedy(os.path.join(args.llama_bin, "llama-server"), gguf, prompt)

            def agree(a, b):
                return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

            at = agree(theirs, expected)
            gap = None
            if at < NEW_TOKENS:  # transformers' logit of its token minus that of llama.cpp's, where they part
                with torch.no_grad():
                    logits = model(torch.tensor([prompt + expected[:at]])).logits[0, -1]
                gap = float(logits[expected[at]] - logits[theirs[at]])
            rows.append(
                {
                    "case": name,
                    "seed": seed,
                    "transformers": expected,
                    "speclm_gguf": ours,
                    "llama_server_gguf": theirs,
                    "speclm_matches_transformers": agree(ours, expected),
                    "llama_cpp_matches_transformers": at,
                    "logit_gap_at_divergence": gap,
                }
            )
            print(name, seed, rows[-1]["speclm_matches_transformers"], rows[-1]["llama_cpp_matches_transformers"])
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    result = {
        "command": "python benchmarks/phi3_llamacpp/phi3_llamacpp.py",
        "machine": f"{platform.machine()} {cpu}",
        "prompt_tokens": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "rows": rows,
    }
    (HERE / "phi3_llamacpp.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# phi3: speclm's GGUF export read by llama.cpp",
        "",
        f"`{result['command']}` on {result['machine']}. Tiny random phi3 checkpoints (LongRoPE past the original",
        "context; speclm exports F32 GGUF with an o200k-split tokenizer, pre `gpt-4o`): greedy tokens that agree",
        f"with transformers' on the checkpoint, of {NEW_TOKENS} after a {PROMPT_LEN}-token prompt (llama-server",
        "given the prompt as token ids, fp32 KV cache: with its default f16 cache one of these tiny random models,",
        "whose activations are large, parted from transformers where the logit gap was 0.8). Where llama.cpp parts,",
        "the gap between the two tokens' logits in transformers says whether it was a near tie.",
        "",
        "| case | seed | speclm (GGUF) | llama.cpp (GGUF) | transformers' logit gap where llama.cpp parts |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['case']} | {r['seed']} | {r['speclm_matches_transformers']}/{NEW_TOKENS} "
        f"| {r['llama_cpp_matches_transformers']}/{NEW_TOKENS} "
        f"| {'' if r['logit_gap_at_divergence'] is None else format(r['logit_gap_at_divergence'], '.2g')} |"
        for r in rows
    ]
    (HERE / "phi3_llamacpp.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
