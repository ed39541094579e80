"""`speclm serve` option errors and a tiny `speclm bench serve` / `speclm bench kv` run on stories260K."""

import json

from speclm.cli import main
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

STORIES = ["--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER, "--threads", "1"]


def test_serve_rejects_bad_options(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert main(["serve", "--block-size", "0"]) == 2
    assert main(["serve", "--max-num-seqs", "0"]) == 2
    err = capsys.readouterr().err
    assert "--port must be in 0..65535, got 70000" in err and "block_size must be in 1..1024, got 0" in err


def test_bench_serve_writes_json_and_markdown(tmp_path, stories_llm):
    from tests.speculative.tree_proposers import write_perturbed_heads

    eagle = write_perturbed_heads(stories_llm.model.config, tmp_path)["eagle"]
    args = [
        "bench",
        "serve",
        *STORIES,
        "--no-chat",
        "--per-category",
        "1",
        "--concurrency",
        "1,3",
        "--requests",
        "3",
        "--max-tokens",
        "6",
        "--methods",
        f"ar,ngram,eagle:{eagle},topk=1",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    data = json.loads((tmp_path / "serve.json").read_text())
    assert list(data["results"]) == ["no speculation", "ngram (K=4, adaptive)", f"eagle:{eagle},topk=1 (K=4, adaptive)"]
    for levels in data["results"].values():
        assert [r["concurrency"] for r in levels] == [1, 3]
        assert all(r["tokens"] == 18 and r["tokens_per_s"] > 0 and r["ttft_p99"] >= r["ttft_p50"] > 0 for r in levels)
    assert "| no speculation | 3 | 3 |" in (tmp_path / "serve.md").read_text()


def test_bench_serve_sends_every_prompt_at_each_level_by_default(tmp_path):
    """Without --requests, a level sends each prompt once (and at least 2 x concurrency requests): the
    per-category table then has every category at every level."""
    args = ["bench", "serve", *STORIES, "--no-chat", "--per-category", "1", "--categories", "writing,qa,math"]
    args += ["--concurrency", "1,2", "--max-tokens", "2", "--methods", "ar", "--out", str(tmp_path)]
    assert main(args) == 0
    data = json.loads((tmp_path / "serve.json").read_text())
    assert [r["requests"] for r in data["results"]["no speculation"]] == [3, 4]
    for cells in data["per_category"].values():
        assert list(cells) == ["math", "qa", "writing", "overall", "median of requests"]


def test_bench_kv_reports_memory_and_agreement(tmp_path):
    args = [
        "bench",
        "kv",
        *STORIES,
        "--no-chat",
        "--per-category",
        "1",
        "--categories",
        "writing,qa",
        "--max-tokens",
        "8",
        "--block-size",
        "4",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    rows = json.loads((tmp_path / "kv_int8.json").read_text())["results"]
    assert rows["auto"]["identical_outputs"] == 1.0 and rows["auto"]["mean_agreeing_prefix"] == 8
    assert rows["int8"]["kv_bytes_per_token"] * 32 == rows["auto"]["kv_bytes_per_token"] * 12


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_drains_in_flight_requests_and_exits(tmp_path):
    """A real `speclm serve` process: a request in flight when SIGTERM arrives still completes (drained),
    and the process exits within seconds."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "speclm", "serve", *STORIES, "--port", str(port), "--drain-seconds", "5"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # never blocks the server
    reader.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not any("listening on" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.05)
        while httpx.get(f"{url}/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        result = {}
        body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "temperature": 0}
        sender = threading.Thread(
            target=lambda: result.update(r=httpx.post(f"{url}/v1/completions", json=body, timeout=30))
        )
        sender.start()
        # SIGTERM once the request is in flight (a connection whose request was not read yet is closed)
        while "speclm_num_requests_in_flight 1.0" not in httpx.get(f"{url}/metrics").text:
            assert sender.is_alive() and time.monotonic() < deadline
            time.sleep(0.02)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises SIGTERM once it has shut down gracefully, so the status is 0 or -SIGTERM
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
        assert time.monotonic() - t0 < 10
        sender.join(10)
        assert result["r"].status_code == 200 and result["r"].json()["usage"]["completion_tokens"] > 0
    finally:
        if proc.poll() is None:
            proc.kill()
