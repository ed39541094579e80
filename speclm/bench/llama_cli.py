"""llama.cpp's own example programs as benchmark peers: plain decoding (`llama-completion`), speculative
decoding with a draft model (`llama-speculative`) and prompt lookup (`llama-lookup`).

Each call runs the program once on one prompt (greedy, EOS ignored) and reads the decoding time it
reports itself, so its model load stays out of the figures. The programs build from the llama.cpp
sources vendored in the llama-cpp-python sdist (docs/benchmarks.md says how); pass their folder as
`speclm bench --llama-bin DIR`.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
PROMPT_EVAL = re.compile(r"prompt eval time =\s+([\d.]+) ms")
EVAL = re.compile(r"\beval time =\s+([\d.]+) ms /\s+(\d+) runs")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")

PEERS = ("llama.cpp", "llama-speculative", "llama-lookup")


@dataclass
class PeerRun:
    text: str  # the generated text alone
    tokens: int
    prefill_seconds: float
    decode_seconds: float
    drafted: int = 0
    accepted: int = 0


class LlamaCliPeer:
    """One of PEERS on a model (and, for llama-speculative, a draft model) with `threads` threads."""

    def __init__(self, name: str, bin_dir: str, model: str, threads: int, draft: str | None = None, k: int = 8):
        if name not in PEERS:
            raise ValueError(f"unknown llama.cpp peer {name!r} (supported: {', '.join(PEERS)})")
        program = {"llama.cpp": "llama-completion", "llama-speculative": "llama-speculative"}.get(name, name)
        self.binary = os.path.join(bin_dir, program)
        if not os.access(self.binary, os.X_OK):
            raise ValueError(f"peer {name} needs {self.binary} (build llama.cpp's examples: docs/benchmarks.md)")
        if name == "llama-speculative" and not draft:
            raise ValueError("peer llama-speculative needs a draft model (a draft:PATH method)")
        self.name, self.model, self.threads, self.draft, self.k = name, model, threads, draft, k

    def command(self, prompt_file: str, max_tokens: int) -> list[str]:
        cmd = [self.binary, "-m", self.model, "-f", prompt_file, "-n", str(max_tokens), "-t", str(self.threads)]
        cmd += ["--temp", "0", "--top-k", "1", "--ignore-eos", "-c", "4096"]
        if self.name == "llama.cpp":
            cmd += ["-no-cnv", "--no-display-prompt", "-tb", str(self.threads)]
        if self.name == "llama-speculative":
            cmd += ["-md", self.draft, "-td", str(self.threads), "--spec-draft-n-max", str(self.k)]
        return cmd

    family = "llama.cpp"  # its greedy text is checked against the first peer of its family (llama.cpp AR)

    def generate(self, prompt_ids: list[int], prompt_text: str, max_tokens: int) -> PeerRun:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(prompt_text)
        try:
            done = subprocess.run(
                self.command(f.name, max_tokens), capture_output=True, text=True, errors="replace", timeout=1800
            )
        finally:
            os.unlink(f.name)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
        return self.parse(done.stdout, done.stderr, prompt_text)

    def parse(self, stdout: str, stderr: str, prompt_text: str) -> PeerRun:
        # The programs print blank lines around the output; all but llama-completion echo the prompt (without
        # its last newline). Leading and trailing newlines are not compared.
        text, prompt = stdout.strip("\n"), prompt_text.rstrip()
        text = (text[len(prompt) :] if text.startswith(prompt) else text).strip("\n")
        if self.name == "llama.cpp":  # llama-completion: common_perf_print's lines
            prefill = float(PROMPT_EVAL.search(stderr).group(1)) / 1000
            decode_ms, runs = EVAL.search(stderr).groups()
            return PeerRun(text, int(runs) + 1, prefill, float(decode_ms) / 1000)
        tokens, seconds = DECODED.search(stderr).groups()
        prefill = float(ENCODED.search(stderr).group(2))
        drafted, accepted = DRAFTED.search(stderr), ACCEPTED.search(stderr)
        return PeerRun(
            text,
            int(tokens),
            prefill,
            float(seconds),
            int(drafted.group(1)) if drafted else 0,
            int(accepted.group(1)) if accepted else 0,
        )


def same_text(a: str, b: str) -> bool:
    """Greedy agreement of two generations that may stop at different token counts (llama.cpp's
    speculative programs overshoot -n by up to a draft): equal on their common length."""
    a, b = a.rstrip(), b.rstrip()
    n = min(len(a), len(b))
    return a[:n] == b[:n]
