"""`speclm bench serve --peers llama-server...` against a stand-in llama-server (tests/bench/fake_llama_server.py)."""

import json
import os
import sys

import pytest

from speclm.bench.llama_server import LlamaServerPeer
from speclm.cli import main
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER


@pytest.fixture
def fake_bin(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "fake_llama_server.py")
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    binary.chmod(0o755)
    return str(binary.parent)


def test_peer_names_and_command(fake_bin):
    plain = LlamaServerPeer("llama-server", fake_bin, "m.gguf", 2)
    assert plain.command(8080, 4, 100)[-7:] == ["-np", "4", "-c", "400", "--seed", "0", "--no-webui"]
    draft = LlamaServerPeer("llama-server:draft", fake_bin, "m.gguf", 2, draft="d.gguf")
    assert draft.command(8080, 1, 100)[-6:] == ["-md", "d.gguf", "-td", "2", "--spec-type", "draft-simple"]
    ngram = LlamaServerPeer("llama-server:ngram-mod", fake_bin, "m.gguf", 2)
    assert ngram.command(8080, 1, 100)[-2:] == ["--spec-type", "ngram-mod"]
    with pytest.raises(ValueError, match="no --spec-type ngram-nope"):
        LlamaServerPeer("llama-server:ngram-nope", fake_bin, "m.gguf", 2)
    with pytest.raises(ValueError, match="needs a draft model"):
        LlamaServerPeer("llama-server:draft", fake_bin, "m.gguf", 2)
    with pytest.raises(ValueError, match="needs --llama-bin"):
        LlamaServerPeer("llama-server", None, "m.gguf", 2)


def test_requests_are_interleaved_across_servers(fake_bin, tmp_path, monkeypatch):
    """Each round of C requests visits every server, the first server rotating: at concurrency 1, A B, B A,
    A B, ... after a warm-up round; at concurrency 2 both requests of a round reach a server together. The
    caller's turn (the in-process engine's) comes before each measured round, with its request ids."""
    from speclm.bench.serve_bench import run_levels

    log = tmp_path / "requests.log"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    a, b = (
        LlamaServerPeer("llama-server", fake_bin, "m.gguf", 1),
        LlamaServerPeer("llama-server", fake_bin, "m.gguf", 1),
    )
    prompts = [[1], [1, 2], [1, 2, 3], [1, 2, 3, 4]]  # a request's prompt length names it

    def turn(level: int, ids: list[int]) -> None:
        with open(log, "a") as f:
            f.write(f"turn {level} {','.join(map(str, ids))}\n")

    with a.serving(1, 64) as url_a, b.serving(1, 64) as url_b:
        rows = run_levels({"A": url_a, "B": url_b}, prompts, [(1, 4), (2, 4)], 3, between_rounds=turn)
    names = {url_a.rsplit(":", 1)[1]: "A", url_b.rsplit(":", 1)[1]: "B"}
    lines = [line.split() for line in log.read_text().splitlines()]
    turns = [(i, level, ids) for i, (word, level, ids) in enumerate(lines) if word == "turn"]
    # after the warm-up's two requests, each round's turn right before its requests (two, then four)
    assert turns == [(2, "0", "0"), (5, "0", "1"), (8, "0", "2"), (11, "0", "3"), (14, "1", "0,1"), (19, "1", "2,3")]
    seen = [(names[port], int(length)) for port, length, n in (line for line in lines if line[0] != "turn")]
    assert seen[:2] == [("A", 1), ("B", 1)]  # the warm-up
    assert seen[2:10] == [("A", 1), ("B", 1), ("B", 2), ("A", 2), ("A", 3), ("B", 3), ("B", 4), ("A", 4)]
    rounds = [sorted(seen[i : i + 2]) for i in range(10, 18, 2)]  # concurrency 2: a round's pair is concurrent
    assert rounds == [[("A", 1), ("A", 2)], [("B", 1), ("B", 2)], [("B", 3), ("B", 4)], [("A", 3), ("A", 4)]]
    for label in "AB":
        assert [r["concurrency"] for r in rows[label]] == [1, 2]
        assert all(r["request_tokens"] == [3, 3, 3, 3] and r["seconds"] > 0 for r in rows[label])


def test_bench_serve_times_llama_server_peers_beside_speclm(tmp_path, fake_bin, capsys):
    args = ["bench", "serve", "--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER, "--threads", "1"]
    args += ["--no-chat", "--per-category", "1", "--categories", "writing,qa", "--concurrency", "1,2"]
    args += ["--max-tokens", "5", "--methods", "ar,ngram", "--compare-inprocess", "--out", str(tmp_path)]
    args += ["--peers", "llama-server,llama-server:ngram-simple,llama-server:ngram-nope", "--llama-bin", fake_bin]
    assert main(args) == 0
    assert "skipping peer llama-server:ngram-nope" in capsys.readouterr().err
    data = json.loads((tmp_path / "serve.json").read_text())
    results = data["results"]
    assert list(results) == ["no speculation", "ngram (K=4, adaptive)", "llama-server", "llama-server:ngram-simple"]
    for name, levels in results.items():
        assert [r["concurrency"] for r in levels] == [1, 2] and all(r["tokens"] == 10 for r in levels)
        # speclm's methods give AR's greedy text; the stand-in's "aaaaa" differs (reported, not failed)
        assert all(r["mismatches"] == (2 if name.startswith("llama") else 0) for r in levels), name
        assert all("texts" not in r for r in levels)
    for row in data["inprocess"].values():
        assert row["server_mismatches"] == 0 and row["other_thread_mismatches"] == 0
        assert row["tokens_per_s"] > 0 and row["server_vs_inprocess"] > 0 and row["other_thread_tokens_per_s"] > 0
    md = (tmp_path / "serve.md").read_text()
    assert "| llama-server | 1 | 2 |" in md and "The server against the in-process engine" in md
    # per category: each mode's own requests (request i asks prompt i), rates and the targets' ratios
    assert data["categories_of_prompts"] == ["writing", "qa"]
    ngram = "ngram (K=4, adaptive)"
    for c, cells in data["per_category"].items():
        assert list(cells) == ["qa", "writing", "overall", "median of requests"]
        level = next(r for r in results[ngram] if r["concurrency"] == int(c))
        qa = cells["qa"]
        assert qa["tokens_per_s"][ngram] == pytest.approx(level["request_tokens"][1] / level["request_seconds"][1])
        rates = qa["tokens_per_s"]
        assert qa["ratios"][f"{ngram} / no speculation"] == pytest.approx(rates[ngram] / rates["no speculation"])
        assert qa["ratios"]["no speculation / llama-server"] == pytest.approx(
            rates["no speculation"] / rates["llama-server"]
        )
    c1 = data["per_category"]["1"]["overall"]
    assert set(c1["tokens_per_s"]) == {*results, "in-process no speculation", f"in-process {ngram}"}
    inproc = data["inprocess"][ngram]
    assert c1["tokens_per_s"][f"in-process {ngram}"] == pytest.approx(inproc["tokens"] / inproc["seconds"])
    assert f"{ngram}: server / in-process" in c1["ratios"]
    assert "## Per category" in md and "### Concurrency 2" in md and "| **overall** |" in md
    made_of = data["inprocess_anatomy"]
    plain = made_of["no speculation"]["overall"]
    assert plain["tau"] == 1.0 and plain["drafts_per_step"] == 0 and plain["proposer_ms_per_step"] == 0
    assert plain["target_ms_per_step"] > 0 and plain["decode_tokens_per_s"] > 0  # plain steps are target time too
    stats = inproc["request_stats"]
    steps, tokens = sum(s["decode_steps"] for s in stats), sum(s["decode_tokens"] for s in stats)
    # (each request's first token is its prompt pass's, not a decoding step's)
    assert made_of[ngram]["overall"]["tau"] == pytest.approx(tokens / steps) and tokens == 2 * (5 - 1)
    assert "## What the in-process runs' speed is made of" in md
