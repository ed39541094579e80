"""Would lookup in a corpus of code pay where prompt lookup finds nothing? The real pair's target answers the
21 code prompts (speclm/data: 16 code, 5 Spec-Bench coding; greedy, 256 tokens, chat template). At every
answer position where prompt lookup (the context's last 2-4 tokens seen earlier in prompt + answer) has no
match, an n-gram model of a corpus proposes 4 tokens: the most frequent continuation of the longest suffix
(2-8 tokens) the corpus holds, token by token. Scored: how many of them the target's answer goes on with
(what verification would accept), by matched length and by the proposal's share of its suffix's
continuations. Corpora: this Python's standard library sources (tests left out), and, leaving each answer
out in turn, the other 20 answers (a stand-in for a corpus of the target's own answers).

    python benchmarks/corpus_lookup/corpus_lookup.py --out benchmarks/corpus_lookup
Writes corpus_lookup.json and .md. Needs `make pair`.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import sysconfig

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
K, MIN_N, MAX_N = 4, 2, 8
MUL = np.uint64(0x9E3779B97F4A7C15)


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    h = np.zeros(len(ids) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * MUL + ids[j : len(ids) - n + 1 + j].astype(np.uint64) + np.uint64(1)
    return h


class NgramModel:
    """For each n-gram (n = MIN_N..MAX_N) of a token array: its most frequent next token, that token's count
    and the n-gram's count."""

    def __init__(self, ids: np.ndarray) -> None:
        self.tables = {}
        for n in range(MIN_N, MAX_N + 1):
            h, nxt = ngram_hashes(ids[:-1], n), ids[n:].astype(np.uint64)
            order = np.lexsort((nxt, h))
            h, nxt = h[order], nxt[order]
            new = np.ones(len(h), bool)
            new[1:] = (h[1:] != h[:-1]) | (nxt[1:] != nxt[:-1])
            starts = np.flatnonzero(new)
            counts = np.diff(np.append(starts, len(h)))
            h, nxt = h[starts], nxt[starts]
            order = np.lexsort((-counts, h))
            h, nxt, counts = h[order], nxt[order], counts[order]
            first = np.flatnonzero(np.append(True, h[1:] != h[:-1]))
            self.tables[n] = (h[first], nxt[first].astype(np.int64), counts[first], np.add.reduceat(counts, first))

    def next(self, context: list[int]) -> tuple[int, int, float] | None:
        """(token, matched length, its share of the suffix's continuations) for the longest known suffix."""
        for n in range(min(MAX_N, len(context)), MIN_N - 1, -1):
            hashes, tokens, counts, totals = self.tables[n]
            h = ngram_hashes(np.asarray(context[-n:], dtype=np.int64), n)[0]
            i = int(np.searchsorted(hashes, h))
            if i < len(hashes) and hashes[i] == h:
                return int(tokens[i]), n, float(counts[i] / totals[i])
        return None

    def propose(self, context: list[int]) -> tuple[list[int], int, float]:
        context, out, first = list(context), [], None
        for _ in range(K):
            step = self.next(context)
            if step is None:
                break
            first = first or step
            out.append(step[0])
            context.append(step[0])
        return out, (first[1] if first else 0), (first[2] if first else 0.0)


def answers() -> tuple[list[dict], object]:
    from speclm import LLM, SamplingParams
    from speclm.data.pair import pair_path

    llm = LLM(pair_path("target"), threads=2)
    rows = []
    for name in ("coding_prompts.jsonl", "specbench_dev.jsonl"):
        for line in open(os.path.join(ROOT, "speclm/data", name)):
            d = json.loads(line)
            if d["category"] in ("code", "coding"):
                chat = [{"role": "user", "content": d["turns"][0]}]
                out = llm.chat(chat, SamplingParams(temperature=0, max_tokens=256))
                rows.append(
                    {"id": d["question_id"], "prompt": llm.tokenizer.encode_chat(chat), "answer": out.token_ids}
                )
    return rows, llm.tokenizer


def stdlib_tokens(tokenizer) -> np.ndarray:
    root = sysconfig.get_paths()["stdlib"]
    texts = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        if "site-packages" not in path and "/test" not in path:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
    ids: list[int] = []
    for enc in tokenizer.backend.encode_batch(texts, add_special_tokens=False):
        ids += enc.ids + [-1]  # -1: a file boundary no n-gram continues across meaningfully
    return np.asarray(ids, dtype=np.int64)


def score(rows: list[dict], model_for) -> tuple[dict, int]:
    """Accepted tokens per proposal, grouped by (matched length, confident), over positions without a
    prompt-lookup match; and the number of positions prompt lookup covered."""
    from speclm.speculative.ngram import find_match

    groups: dict = collections.defaultdict(lambda: {"positions": 0, "accepted": 0})
    covered = 0
    for j, row in enumerate(rows):
        model = model_for(j)
        for i in range(len(row["answer"])):
            context, truth = row["prompt"] + row["answer"][:i], row["answer"][i : i + K]
            if find_match(context, K, 2, 4)[1]:
                covered += 1
                continue
            proposal, n, share = model.propose(context)
            accepted = next(
                (a for a, (x, y) in enumerate(zip(proposal, truth)) if x != y), min(len(proposal), len(truth))
            )
            key = (
                f"n={min(n, 6)}{'+' if n >= 6 else ''}, share {'> 0.5' if share > 0.5 else '<= 0.5'}"
                if n
                else "no match"
            )
            groups[key]["positions"] += 1
            groups[key]["accepted"] += accepted
    return dict(groups), covered


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=HERE)
    # The break-even: a lookup step is one verification (T_t) and commits 1 + a tokens; a draft step
    # commits tau tokens in T_t + T_d. Defaults: code in process, benchmarks/serve_avx512/
    # serve_avx512_epyc_full_share16b.md (AMD EPYC Zen 4).
    p.add_argument("--target-ms", type=float, default=35.0)
    p.add_argument("--draft-ms", type=float, default=18.3)
    p.add_argument("--tau", type=float, default=2.67)
    args = p.parse_args()
    from speclm.bench.machine import machine_info

    rows, tokenizer = answers()
    stdlib = NgramModel(stdlib_tokens(tokenizer))
    corpora = {"Python standard library": lambda j: stdlib}

    def others(j: int) -> NgramModel:
        ids = [t for q, row in enumerate(rows) if q != j for t in row["answer"] + [-1]]
        return NgramModel(np.asarray(ids, dtype=np.int64))

    corpora["the other 20 answers"] = others
    results = {}
    for name, model_for in corpora.items():
        groups, covered = score(rows, model_for)
        results[name] = {"covered_by_prompt_lookup": covered, "groups": groups}
        print(name, covered, groups, flush=True)
    break_even = args.tau * args.target_ms / (args.target_ms + args.draft_ms) - 1
    machine = machine_info()
    command = "python benchmarks/corpus_lookup/corpus_lookup.py --out benchmarks/corpus_lookup"
    positions = sum(len(r["answer"]) for r in rows)
    with open(os.path.join(args.out, "corpus_lookup.json"), "w") as f:
        json.dump({"command": command, "machine": machine, "positions": positions, "break_even": break_even,
                   "results": results, "answers": rows}, f)  # fmt: skip
    lines = [
        "# Lookup in a corpus where prompt lookup finds nothing: code answers of the real pair's target",
        "",
        f"Command: `{command}`; machine: {machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}.",
        f"{len(rows)} answers, {positions} positions. A proposal is 4 tokens; accepted = how many of them the "
        "target's answer continues with. Share: the proposal's first token's share of its suffix's continuations "
        "in the corpus.",
        "",
        f"Break-even against the draft model: a step by lookup is one verification ({args.target_ms} ms) and "
        f"commits 1 + a tokens; a draft step commits tau = {args.tau} in {args.target_ms} + {args.draft_ms} ms "
        f"(code, in process, `../serve_avx512/serve_avx512_epyc_full_share16b.md`). Lookup wins a step where "
        f"a > {break_even:.2f} accepted tokens.",
        "",
        "| corpus | positions prompt lookup covers | matched suffix | positions | mean accepted |",
        "|---|---:|---|---:|---:|",
    ]
    for name, res in results.items():
        for key in sorted(res["groups"]):
            g = res["groups"][key]
            mean = g["accepted"] / g["positions"]
            lines.append(f"| {name} | {res['covered_by_prompt_lookup']} | {key} | {g['positions']} | {mean:.2f} |")
    with open(os.path.join(args.out, "corpus_lookup.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
