"""Run several decoding methods over the same prompts and aggregate speed and acceptance."""

from __future__ import annotations

import sys
import time
from collections import defaultdict

from tqdm import tqdm

from speclm.bench.llama_cli import same_text
from speclm.llm import LLM
from speclm.sampling_params import SamplingParams


def parse_method(method: str, k: int | None, adaptive: bool) -> tuple[str | None, int | None, bool]:
    """'ar' is plain decoding (spec None); anything else is a --spec value, optionally ending in @K for a
    fixed K (e.g. draft:PATH@4) instead of the run's K and adaptivity."""
    if method == "ar":
        return None, k, adaptive
    spec, at, fixed = method.rpartition("@")
    if at and fixed.isdigit():
        return spec, int(fixed), False
    return method, k, adaptive


def method_llm(base: LLM, method: str, k: int, adaptive: bool) -> LLM:
    return base.with_spec(*parse_method(method, k, adaptive))


def run_methods(
    base: LLM,
    prompts: list[dict],
    methods: list[str],
    params: SamplingParams,
    k: int = 4,
    adaptive: bool = True,
    chat: bool = True,
    progress: bool = True,
    peers: list | None = None,
) -> list[dict]:
    """One record per (prompt, method). Methods run interleaved per prompt so that drifts in the
    machine's speed affect them alike. `peers` (speclm.bench.llama_cli.LlamaCliPeer,
    speclm.bench.peers.TransformersBenchPeer) run after speclm's methods on each prompt; their greedy
    agreement is checked against the first peer of their family (that engine's own AR)."""
    peers = peers or []
    llms = {m: method_llm(base, m, k, adaptive) for m in methods}
    encoded = [
        base.tokenizer.encode_chat([{"role": "user", "content": p["text"]}])
        if chat
        else base.tokenizer.encode(p["text"])
        for p in prompts
    ]
    fits = [len(ids) + params.max_tokens <= base.model.config.max_position_embeddings for ids in encoded]
    if not all(fits):
        print(f"skipping {fits.count(False)} prompt(s) longer than the model's context", file=sys.stderr)
        prompts = [p for p, ok in zip(prompts, fits) if ok]
        encoded = [ids for ids, ok in zip(encoded, fits) if ok]
    warm = SamplingParams(max_tokens=4)
    for llm in llms.values():  # first-call costs (allocator, lazy init) stay out of the timings
        llm.generate(encoded[0], warm)
    records = []
    bar = tqdm(total=len(prompts) * (len(methods) + len(peers)), desc="bench", unit="gen", disable=not progress)
    for prompt, ids in zip(prompts, encoded):
        reference = None
        for method in methods:
            t0 = time.perf_counter()
            out = llms[method].generate(ids, params)[0]
            wall = time.perf_counter() - t0
            s = out.stats
            if reference is None:
                reference = out.token_ids
            records.append(
                {
                    "prompt_id": prompt["id"],
                    "category": prompt["category"],
                    "method": method,
                    "prompt_tokens": s.prompt_tokens,
                    "tokens": s.completion_tokens,
                    "seconds": wall,
                    "decode_seconds": wall - s.prefill_seconds,
                    "target_forwards": s.target_forwards,
                    "decode_steps": s.decode_steps,
                    "decode_tokens": s.decode_tokens,
                    "drafted": s.drafted_tokens,
                    "accepted": s.accepted_tokens,
                    "drafted_per_position": s.drafted_per_position,
                    "accepted_per_position": s.accepted_per_position,
                    "proposer_seconds": s.proposer_seconds,
                    "matches_first_method": out.token_ids == reference,
                }
            )
            bar.update(1)
        peer_reference: dict[str, str] = {}
        for peer in peers:
            run = peer.generate(ids, base.tokenizer.decode(ids, skip_special_tokens=False), params.max_tokens)
            family_reference = peer_reference.setdefault(peer.family, run.text)
            records.append(peer_record(prompt, peer.name, run, same_text(run.text, family_reference)))
            bar.update(1)
    bar.close()
    return records


def peer_record(prompt: dict, method: str, run, matches: bool) -> dict:
    """A record of a peer's run in run_methods' schema (per-position acceptance is not reported)."""
    return {
        "prompt_id": prompt["id"],
        "category": prompt["category"],
        "method": method,
        "prompt_tokens": 0,
        "tokens": run.tokens,
        "seconds": run.prefill_seconds + run.decode_seconds,
        "decode_seconds": run.decode_seconds,
        "target_forwards": run.tokens - run.accepted,  # each target pass commits its accepted drafts + 1
        "decode_steps": run.tokens - run.accepted,
        "decode_tokens": run.tokens,
        "drafted": run.drafted,
        "accepted": run.accepted,
        "drafted_per_position": [],
        "accepted_per_position": [],
        "proposer_seconds": 0.0,
        "matches_first_method": matches,
    }


def aggregate(records: list[dict], baseline: str = "ar", peer_baseline: str = "llama.cpp") -> dict:
    """Per category (and 'overall') per method: tokens/s, speedup over the baseline (and over the peer
    baseline when it ran), tau, acceptance."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["category"], r["method"])].append(r)
        groups[("overall", r["method"])].append(r)
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    for (category, method), rows in groups.items():
        tokens = sum(r["tokens"] for r in rows)
        seconds = sum(r["seconds"] for r in rows)
        drafted = sum(r["drafted"] for r in rows)
        steps = sum(r["decode_steps"] for r in rows)
        width = max((len(r["drafted_per_position"]) for r in rows), default=0)
        per_pos = []
        for i in range(width):
            d = sum(r["drafted_per_position"][i] for r in rows if i < len(r["drafted_per_position"]))
            a = sum(r["accepted_per_position"][i] for r in rows if i < len(r["accepted_per_position"]))
            per_pos.append(a / d if d else 0.0)
        table[category][method] = {
            "prompts": len(rows),
            "tokens": tokens,
            "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            # Speculation can only shorten decoding; on long prompts prefill dominates the wall time.
            "decode_tokens_per_s": tokens / decode if (decode := sum(r["decode_seconds"] for r in rows)) else 0.0,
            "mean_accepted_length": sum(r["decode_tokens"] for r in rows) / steps if steps else 1.0,
            "acceptance_rate": sum(r["accepted"] for r in rows) / drafted if drafted else 0.0,
            "per_position_acceptance": per_pos,
            "proposer_share": sum(r["proposer_seconds"] for r in rows) / seconds if seconds else 0.0,
            "greedy_mismatches": sum(not r["matches_first_method"] for r in rows),
        }
    for methods in table.values():
        base, peer = methods.get(baseline), methods.get(peer_baseline)
        for m in methods.values():
            if peer:
                m["vs_peer"] = m["tokens_per_s"] / peer["tokens_per_s"]
                m["decode_vs_peer"] = m["decode_tokens_per_s"] / peer["decode_tokens_per_s"]
            m["speedup"] = m["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None
            m["decode_speedup"] = (
                m["decode_tokens_per_s"] / base["decode_tokens_per_s"] if base and base["decode_tokens_per_s"] else None
            )
    return dict(table)
