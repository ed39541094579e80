"""A benchmark's server in a process of its own (speclm's `speclm serve`, llama.cpp's `llama-server`): started
on a free port, its URL handed out once /health answers 200, stopped afterwards."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(name: str, command: Callable[[int], list[str]], timeout: float = 600.0) -> Iterator[str]:
    """Run `command(port)`, yield its URL once /health answers 200, and stop it. A client's RuntimeError
    comes back with the end of the server's log (a crash, a refused request)."""
    import httpx

    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT)
        try:
            url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"{name} exited ({proc.returncode}): {log.read()[-800:]}")
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not answer /health within {timeout:g} s")
                time.sleep(0.2)
            try:
                yield url
            except RuntimeError as e:
                log.seek(0)
                raise RuntimeError(f"{e} ({name} exit status {proc.poll()}; its log ends: {log.read()[-1500:]})") from e
        finally:  # killed: a benchmark's server holds nothing a graceful stop would save
            proc.kill()
            proc.wait()
