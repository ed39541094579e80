"""`speclm bench serve`'s per-category rows: each mode's tokens/s on each prompt category, and the ratios
that speclm's targets name (speculation over plain decoding through the same server, each speclm mode
over llama-server's plain decoding, the server over the in-process engine). Two summary rows: overall
(all generated tokens over all the requests' time, so long requests weigh more) and the median over
requests (of each mode's per-request tokens/s, and of each ratio taken request by request)."""

from __future__ import annotations

import statistics

from speclm.bench.report import short_label

PLAIN = "no speculation"  # speclm's plain decoding, the label run_serve gives method "ar"
PEER_PLAIN = "llama-server"  # llama-server's plain decoding (speclm/bench/llama_server.py)
OVERALL = "overall"
MEDIAN = "median of requests"
SUMMARIES = (OVERALL, MEDIAN)  # the rows after the categories, in this order


def _rate(rows: list[tuple[int, float]]) -> float:
    """Generated tokens over the requests' own time (first byte sent to last chunk received): at
    concurrency 1 the throughput, at higher levels the speed each client sees."""
    seconds = sum(s for _, s in rows)
    return sum(t for t, _ in rows) / seconds if seconds > 0 else 0.0


def _by_category(row: dict, categories: list[str]) -> dict[str, float]:
    """A level's (or an in-process run's) rate per category and overall; request i asks prompt i (mod the prompts)."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for i, pair in enumerate(zip(row["request_tokens"], row["request_seconds"])):
        groups.setdefault(categories[i % len(categories)], []).append(pair)
    rates = {c: _rate(rows) for c, rows in groups.items()}
    rates[OVERALL] = _rate([p for rows in groups.values() for p in rows])
    return rates


def _per_request(row: dict) -> list[float]:
    return [_rate([pair]) for pair in zip(row["request_tokens"], row["request_seconds"])]


def category_results(results: dict, inprocess: dict, categories: list[str], speclm_modes: list[str]) -> dict:
    """{concurrency: {category: {"tokens_per_s": {mode: rate}, "ratios": {name: ratio}}}}; in-process runs
    appear at concurrency 1 as "in-process MODE". `speclm_modes`: the labels of speclm's own methods."""
    runs = [(mode, level["concurrency"], level) for mode, levels in results.items() for level in levels]
    runs += [(f"in-process {mode}", 1, row) for mode, row in inprocess.items()]
    table: dict[int, dict[str, dict]] = {}
    requests: dict[int, dict[str, list[float]]] = {}  # per-request rates, for the median row
    for mode, concurrency, row in runs:
        for category, rate in _by_category(row, categories).items():
            cell = table.setdefault(concurrency, {}).setdefault(category, {"tokens_per_s": {}})
            cell["tokens_per_s"][mode] = rate
        requests.setdefault(concurrency, {})[mode] = _per_request(row)
    for concurrency, cells in table.items():
        for cell in cells.values():
            cell["ratios"] = _ratios(cell["tokens_per_s"], speclm_modes)
        cells[MEDIAN] = _median_cell(requests[concurrency], speclm_modes)
    return {c: dict(sorted(cells.items(), key=_row_order)) for c, cells in sorted(table.items())}


def _row_order(cell: tuple[str, dict]) -> tuple[int, str]:
    """Categories alphabetically, then the summary rows."""
    name = cell[0]
    return (SUMMARIES.index(name) + 1, "") if name in SUMMARIES else (0, name)


def _median_cell(requests: dict[str, list[float]], speclm_modes: list[str]) -> dict:
    """The median row: each mode's median per-request tokens/s, and each ratio's median over the requests
    that both modes ran (request i of one mode asked what request i of the other did)."""
    ratios: dict[str, list[float]] = {}
    for i in range(max(map(len, requests.values()), default=0)):
        rates = {mode: rs[i] for mode, rs in requests.items() if i < len(rs)}
        for name, ratio in _ratios(rates, speclm_modes).items():
            ratios.setdefault(name, []).append(ratio)
    return {
        "tokens_per_s": {mode: statistics.median(rs) for mode, rs in requests.items() if rs},
        "ratios": {name: statistics.median(rs) for name, rs in ratios.items()},
    }


def _ratios(rates: dict[str, float], speclm_modes: list[str]) -> dict[str, float]:
    ratios = {}

    def put(name: str, a: str, b: str) -> None:
        if rates.get(a) and rates.get(b):
            ratios[name] = rates[a] / rates[b]

    for mode in speclm_modes:
        if mode != PLAIN:
            put(f"{mode} / {PLAIN}", mode, PLAIN)
    for mode in speclm_modes:
        put(f"{mode} / {PEER_PLAIN}", mode, PEER_PLAIN)
    for mode in speclm_modes:
        put(f"{mode}: server / in-process", mode, f"in-process {mode}")
    return ratios


def anatomy(inprocess: dict, categories: list[str]) -> dict:
    """{mode: {category: ...}} from the in-process runs: tau (tokens per target pass after prefill), the
    proposer's and the target's seconds per decoding step, prefill seconds per request, and the decode
    phase's tokens/s: what limits speculation's gain in each category."""
    out: dict[str, dict] = {}
    for mode, row in inprocess.items():
        groups: dict[str, list[dict]] = {}
        for i, stats in enumerate(row.get("request_stats", [])):
            groups.setdefault(categories[i % len(categories)], []).append(stats)
        groups[OVERALL] = [s for g in list(groups.values()) for s in g]
        out[mode] = {}
        for category, group in groups.items():
            total = {k: sum(s[k] for s in group) for k in group[0]}
            steps = max(total["decode_steps"], 1)
            decode_seconds = total["proposer_seconds"] + total["target_seconds"]
            out[mode][category] = {
                "tau": total["decode_tokens"] / steps,
                "acceptance": total["accepted_tokens"] / total["drafted_tokens"] if total["drafted_tokens"] else 0.0,
                "drafts_per_step": total["drafted_tokens"] / steps,
                "proposer_ms_per_step": 1000 * total["proposer_seconds"] / steps,
                "target_ms_per_step": 1000 * total["target_seconds"] / steps,
                "prefill_s_per_request": total["prefill_seconds"] / len(group),
                "decode_tokens_per_s": total["decode_tokens"] / decode_seconds if decode_seconds > 0 else 0.0,
            }
    return out


def anatomy_markdown(rows: dict) -> list[str]:
    lines = [
        "",
        "## What the in-process runs' speed is made of",
        "",
        "Per decoding step (a target pass after prefill): tau = tokens committed, drafts proposed, the proposer's "
        "and the target's milliseconds; prefill seconds per request; decode tokens/s leaves prefill out.",
        "",
        "| mode | category | tau | acceptance | drafts/step | proposer ms/step | target ms/step | prefill s/request "
        "| decode tokens/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, cells in rows.items():
        for category, r in sorted(cells.items(), key=lambda kv: (kv[0] == OVERALL, kv[0])):
            lines.append(
                f"| {short_label(mode)} | {category} | {r['tau']:.2f} | {100 * r['acceptance']:.0f}% | "
                f"{r['drafts_per_step']:.2f} | {r['proposer_ms_per_step']:.1f} | {r['target_ms_per_step']:.1f} | "
                f"{r['prefill_s_per_request']:.2f} | {r['decode_tokens_per_s']:.1f} |"
            )
    return lines


def category_markdown(table: dict) -> list[str]:
    """One table per concurrency level: categories down, modes' tokens/s and the ratios across."""
    lines = [
        "",
        "## Per category",
        "",
        "tokens/s here are each category's generated tokens over its requests' own time (request sent to last "
        "chunk): at concurrency 1 the throughput, above it the speed each client sees. Ratios are between "
        "modes of the same run on the same requests. overall: all the tokens over all the time; median of "
        "requests: the median request's tokens/s, and the median of the ratios taken request by request.",
    ]
    for concurrency, cells in table.items():
        modes = list(dict.fromkeys(m for cell in cells.values() for m in cell["tokens_per_s"]))
        names = list(dict.fromkeys(r for cell in cells.values() for r in cell["ratios"]))
        lines += [
            "",
            f"### Concurrency {concurrency}",
            "",
            "| " + " | ".join(["category", *map(short_label, modes), *map(_ratio_label, names)]) + " |",
            "|---|" + "---:|" * (len(modes) + len(names)),
        ]
        for category, cell in cells.items():
            rates = [f"{cell['tokens_per_s'][m]:.1f}" if m in cell["tokens_per_s"] else "-" for m in modes]
            ratios = [f"{cell['ratios'][n]:.2f}x" if n in cell["ratios"] else "-" for n in names]
            name = f"**{category}**" if category in SUMMARIES else category
            lines.append(f"| {name} | " + " | ".join(rates + ratios) + " |")
    return lines


def _ratio_label(name: str) -> str:
    """A ratio's column name with each side's paths cut (short_label alone would cut across the " / ")."""
    return " / ".join(short_label(side) for side in name.split(" / "))
