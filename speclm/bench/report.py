"""Write benchmark results as JSON, a markdown table and a PNG plot."""

from __future__ import annotations

import json
import os
import re


def short_label(method: str) -> str:
    """A method as tables and plots show it: file paths cut to their base names."""
    return re.sub(r"[^,:@]*/", "", method)


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)


def header_lines(title: str, command: str, machine: dict, after: str = "", threads: int | None = None) -> list[str]:
    """A benchmark file's opening lines: its title, the command that wrote it, and the machine (CPU, cores,
    torch and its threads, then `after`)."""
    threads = machine.get("torch_threads") if threads is None else threads
    return [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, torch {machine.get('torch')} "
        f"({threads} threads){after}",
        "",
    ]


def markdown_table(
    summary: dict, methods: list[str], title: str, command: str, machine: dict, greedy: bool = True
) -> str:
    """The per-category table. Output mismatches against the first method only mean something for
    greedy runs (sampled runs draw different random numbers per method), so they show as "-" otherwise."""
    lines = [
        *header_lines(title, command, machine),
        "tokens/s and speedup count the whole request (prefill included); decode columns leave prefill out.",
        "",
        "| category | method | prompts | tokens/s | speedup vs AR | decode tokens/s | decode speedup | tau "
        "| acceptance | per-position acceptance | greedy mismatches |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    peers = any("vs_peer" in m for c in summary.values() for m in c.values())
    if peers:  # the same rows with two more columns: ratios to llama.cpp's plain decoding in the same run
        lines[-4] += ' Columns "vs llama.cpp": the ratio to llama.cpp AR in the same run; '
        "llama.cpp peers' greedy mismatches count against llama.cpp AR."
        lines[-2] += " vs llama.cpp | decode vs llama.cpp |"
        lines[-1] += "---:|---:|"
    categories = sorted(c for c in summary if c != "overall") + ["overall"]
    for category in categories:
        for method in methods:
            m = summary.get(category, {}).get(method)
            if m is None:
                continue
            per_pos = " ".join(f"{x:.2f}" for x in m["per_position_acceptance"]) or "-"
            speedup = f"{m['speedup']:.2f}x" if m.get("speedup") else "-"
            decode_speedup = f"{m['decode_speedup']:.2f}x" if m.get("decode_speedup") else "-"
            acc = f"{100 * m['acceptance_rate']:.0f}%" if method != "ar" else "-"
            name = f"**{category}**" if category == "overall" else category
            lines.append(
                f"| {name} | {short_label(method)} | {m['prompts']} | {m['tokens_per_s']:.1f} | {speedup} | "
                f"{m.get('decode_tokens_per_s', 0):.1f} | {decode_speedup} | "
                f"{m['mean_accepted_length']:.2f} | {acc} | {per_pos} | {m['greedy_mismatches'] if greedy else '-'} |"
            )
            if peers:
                lines[-1] += f" {m.get('vs_peer', 0):.2f}x | {m.get('decode_vs_peer', 0):.2f}x |"
    return "\n".join(lines) + "\n"


def pyplot():
    """matplotlib.pyplot on a file-only backend; matplotlib is the `bench` extra, not a runtime dependency,
    so it is imported here, when a plot is made, and its absence says how to install it."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("speclm bench plots with matplotlib: pip install 'speclm[bench]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedups(path: str, summary: dict, methods: list[str], title: str) -> None:
    plt = pyplot()
    categories = sorted(c for c in summary if c != "overall") + ["overall"]
    spec_methods = [m for m in methods if m != "ar"]
    width = 0.8 / max(len(spec_methods), 1)
    fig, ax = plt.subplots(figsize=(max(8, len(categories) * 0.9), 4.5))
    for i, method in enumerate(spec_methods):
        values = [summary.get(c, {}).get(method, {}).get("speedup") or 0 for c in categories]
        ax.bar([x + i * width for x in range(len(categories))], values, width, label=short_label(method))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks([x + width * (len(spec_methods) - 1) / 2 for x in range(len(categories))])
    ax.set_xticklabels(categories, rotation=30, ha="right")
    ax.set_ylabel("speedup over AR (same run)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out_dir: str, name: str, payload: dict, table: str) -> None:
    """NAME.json (payload) and NAME.md (table) under out_dir; the table is printed too."""
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, f"{name}.json"), payload)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(table)
    print(table)


def output_paths(out_dir: str, name: str) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    return {ext: os.path.join(out_dir, f"{name}.{ext}") for ext in ("json", "md", "png")}
