"""llama.cpp's `llama-server` as a `speclm bench serve` peer: plain, with a draft model (`-md`) or with one
of its n-gram speculation types (`--spec-type`), started by the benchmark on a free port with one slot per
client (`-np C`) and stopped after the level; the same clients and requests as speclm's server."""

from __future__ import annotations

import os
import re
import subprocess

from speclm.bench.server_process import server_process

PEER = "llama-server"  # plain; "llama-server:draft" adds -md DRAFT (draft-simple), ":TYPE" --spec-type TYPE


class LlamaServerPeer:
    """One llama-server configuration on `model` with `threads` threads (see PEER for the names)."""

    family = "llama.cpp"

    def __init__(self, name: str, bin_dir: str | None, model: str, threads: int, draft: str | None = None) -> None:
        if name != PEER and not name.startswith(PEER + ":"):
            raise ValueError(
                f"unknown llama-server peer {name!r} (llama-server, llama-server:draft, llama-server:TYPE)"
            )
        if not bin_dir:
            raise ValueError(f"peer {name} needs --llama-bin DIR (llama.cpp's programs; docs/benchmarks.md)")
        self.binary = os.path.join(bin_dir, "llama-server")
        if not os.access(self.binary, os.X_OK):
            raise ValueError(f"peer {name} needs {self.binary} (build llama.cpp's tools: docs/benchmarks.md)")
        self.name, self.model, self.threads, self.draft = name, model, threads, draft
        self.kind = name.split(":", 1)[1] if ":" in name else None
        if self.kind == "draft" and not draft:
            raise ValueError(f"peer {name} needs a draft model (a draft:PATH method)")
        if self.kind not in (None, "draft"):
            help_text = subprocess.run([self.binary, "--help"], capture_output=True, text=True, timeout=60)
            types = set(re.findall(r"\b(?:ngram|draft)-[a-z0-9]+(?:-[a-z0-9]+)*", help_text.stdout + help_text.stderr))
            if self.kind not in types:
                raise ValueError(
                    f"peer {name}: this llama-server has no --spec-type {self.kind} "
                    f"(it has: {', '.join(sorted(types))})"
                )

    def command(self, port: int, slots: int, context: int) -> list[str]:
        cmd = [self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["-t", str(self.threads), "-tb", str(self.threads), "-np", str(slots), "-c", str(context * slots)]
        cmd += ["--seed", "0", "--no-webui"]
        if self.kind == "draft":
            # named: without --spec-type this llama-server infers the type from the draft's GGUF, if any
            cmd += ["-md", self.draft, "-td", str(self.threads), "--spec-type", "draft-simple"]
        elif self.kind is not None:
            cmd += ["--spec-type", self.kind]
        return cmd

    def serving(self, slots: int, context: int):
        """A context manager: the server with `slots` slots of `context` tokens, yielding its URL."""
        return server_process(self.name, lambda port: self.command(port, slots, context))
