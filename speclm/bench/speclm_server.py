"""speclm's own server as `speclm bench serve` runs it: `speclm serve` in a process of its own, as a user
starts it (the engine on the thread that loaded the model; one OpenMP team per process), with the
benchmark's model and cache options and one decoding method."""

from __future__ import annotations

import sys

from speclm.bench.server_process import server_process


class SpeclmServer:
    """`speclm serve` with `options` (its command-line options: model, threads, cache) and `spec` (a --spec
    method; None: no speculation)."""

    def __init__(self, name: str, options: list[str], spec: str | None, k: int | None, adaptive: bool) -> None:
        self.name = name
        self.argv = [sys.executable, "-m", "speclm", "serve", *options]
        if spec is not None:
            self.argv += (
                ["--spec", spec] + ([] if k is None else ["--k", str(k)]) + ([] if adaptive else ["--no-adaptive"])
            )

    def serving(self, slots: int, context: int):
        """A context manager yielding the server's URL (its pool is sized by the cache options; `slots` and
        `context` are for peers that need them)."""
        return server_process(self.name, lambda port: [*self.argv, "--port", str(port)])
