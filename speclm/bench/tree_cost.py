"""What one tree verification pass costs next to a one-token decoding pass, by node count."""

from __future__ import annotations

import statistics
import time

from speclm.bench.report import header_lines
from speclm.engine.model_runner import ModelRunner
from speclm.models.attention import BatchEntry
from speclm.sample.tree import TokenTree
from speclm.speculative.medusa import static_tree


def bushy_tree(num_nodes: int, width: int = 3, depth: int = 5) -> TokenTree:
    """The default Medusa-shaped tree of num_nodes (branches at every level, so paths get copied)."""
    paths = static_tree(depth, num_nodes, width)
    index = {p: i for i, p in enumerate(paths)}
    return TokenTree(tuple(index.get(p[:-1], -1) for p in paths))


def measure_tree_cost(runner: ModelRunner, sizes: list[int], context: int, repeats: int) -> list[dict]:
    """Seconds (best of `repeats` rounds; medians too) of target passes as the engine runs them (one
    sequence in a paged cache holding `context` tokens): a one-token decoding pass; per N, a tree pass
    over the pending token + N nodes (bushy tree), the same with logits for a 3-row path only (lazy),
    and a chain pass over N + 1 rows. The variants are timed round-robin so that load from other
    processes hits them alike."""
    block_size = 16
    cache = runner.new_paged_cache(-(-(context + max(sizes) + 2) // block_size), block_size)
    prompt = [(7 * i + 3) % runner.config.vocab_size for i in range(context + 1)]
    runner.forward_batch(cache, [BatchEntry(prompt[:context], 0, list(range(context)), 0)])

    def entry(n: int, tree: TokenTree | None = None, logits: bool = True) -> BatchEntry:
        tokens = prompt[context:] + prompt[:n]
        paths = None if tree is None else tree.row_paths()
        return BatchEntry(tokens, context, list(range(context + n + 1)), n + 1 if logits else 0, paths)

    passes = {("one", 0): lambda: runner.forward_batch(cache, [entry(0)])}
    for n in sizes:
        tree = bushy_tree(n)
        passes["tree", n] = lambda n=n, tr=tree: runner.forward_batch(cache, [entry(n, tr)])
        passes["lazy", n] = lambda n=n, tr=tree: _lazy_tree_pass(runner, cache, entry(n, tr, logits=False), tr)
        passes["chain", n] = lambda n=n: runner.forward_batch(cache, [entry(n)])
    times: dict = {key: [] for key in passes}
    for round_ in range(repeats + 1):
        for key, fn in passes.items():
            t0 = time.perf_counter()
            fn()
            if round_:  # round 0 warms up
                times[key].append(time.perf_counter() - t0)
    records = []
    for n in sizes:
        # Best of the rounds: on a shared machine other processes only ever add time.
        record = {
            "nodes": n,
            "depth": bushy_tree(n).max_depth,
            "one_token_s": min(times["one", 0]),
            "tree_s": min(times["tree", n]),
            "chain_s": min(times["chain", n]),
            "lazy_tree_s": min(times["lazy", n]),
        }
        record |= {
            f"{key}_median_s": statistics.median(times[key, n if key != "one" else 0])
            for key in ("one", "tree", "chain", "lazy")
        }
        record["tree_over_one"] = record["tree_s"] / record["one_token_s"]
        records.append(record)
    return records


def _lazy_tree_pass(runner: ModelRunner, cache, entry: BatchEntry, tree: TokenTree) -> None:
    """The tree pass with logits for a root-to-depth-2 path only (3 one-row head calls, what the
    engine does for trees of LAZY_LOGITS_NODES nodes or more when two drafts are accepted)."""
    _, hidden, _ = runner.forward_batch(cache, [entry])
    row_logits = runner.row_logits(hidden)
    for row in tree.row_paths()[-1][:3]:
        row_logits.row(row)


def markdown(records: list[dict], title: str, command: str, machine: dict) -> str:
    load = machine.get("load_average_1min")
    lines = [
        *header_lines(
            title,
            command,
            machine,
            f"; 1-minute load average at the end {load} (other jobs shared the cores: best-of-rounds damps, not "
            "removes, their noise)",
        ),
        "Best-of-rounds ms (medians in the JSON) per target pass over the pending token + N draft nodes (a bushy "
        "tree as the default Medusa tree); `chain` = the same row count as a chain; `lazy` = the tree pass with "
        "logits for a 3-row path only (the engine's way for trees of 4+ nodes).",
        "",
        "| nodes N | depth | 1-token pass ms | tree pass ms | tree / 1-token | lazy tree ms | lazy / 1-token | "
        "chain (N+1 rows) ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['nodes']} | {r['depth']} | {1e3 * r['one_token_s']:.2f} | {1e3 * r['tree_s']:.2f} | "
            f"{r['tree_over_one']:.2f}x | {1e3 * r['lazy_tree_s']:.2f} | {r['lazy_tree_s'] / r['one_token_s']:.2f}x | "
            f"{1e3 * r['chain_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def parse_sizes(args) -> list[int]:
    """--nodes as a list of node counts; ValueError for bad --nodes, --context or --rounds."""
    sizes = (
        [int(n) for n in args.nodes.split(",") if n.strip()] if args.nodes.replace(",", "").strip().isdigit() else []
    )
    if not sizes or min(sizes) < 1 or args.context < 1 or args.rounds < 1:
        raise ValueError(
            f"--nodes must list counts >= 1 and --context/--rounds be >= 1; got {args.nodes!r}, "
            f"{args.context}, {args.rounds}"
        )
    return sizes


def run_tree(llm, sizes: list[int], args) -> int:
    """`speclm bench tree`: time the passes on `llm` and write JSON + markdown under --out."""
    import os
    import shlex
    import sys

    from speclm.bench.machine import machine_info
    from speclm.bench.report import write_report

    records = measure_tree_cost(llm.runner, sizes, args.context, args.rounds)
    machine = machine_info() | {"load_average_1min": round(os.getloadavg()[0], 2)}
    command = "speclm bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    title = (
        f"tree verification cost: {os.path.basename(llm.model_path)}, --weights {llm.weights.label}, "
        f"context {args.context}"
    )
    table = markdown(records, title, command, machine)
    payload = {"command": command, "machine": machine, "records": records}
    write_report(args.out, args.name or "tree_cost", payload, table)
    return 0
