"""Would the real pair's 0.5B draft pay with its last layers skipped? The draft's head read after its first N
of 24 layers (its final norm kept): cheaper passes, less agreement. Speculative decoding with the `draft:`
defaults (Q4_0 weights, the 32768-token head map) on code prompts, 192 tokens each, greedy; the layer counts
interleaved per prompt, two rounds, every run with a fresh draft cache (no prompt memo). The target verifies
every draft, so the output is the target's whatever N is (checked); only the speed moves.
Usage (needs `make pair`):

    python benchmarks/draft_layers/draft_layers.py --out benchmarks/draft_layers
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import speclm.speculative.draft_model as draft_model
from speclm import LLM, SamplingParams
from speclm.bench.machine import machine_info
from speclm.data.pair import pair_path

LAYERS = (None, 23, 22, 21)  # None: all 24
PROMPTS, ROUNDS, TOKENS = 6, 2, 192


def fetched_pair() -> tuple[str, str]:
    """The real pair's (target, draft) files, or exit with one error line."""
    target, draft = pair_path("target"), pair_path("draft")
    if target is None or draft is None:
        raise SystemExit("error: the pair is not fetched (make pair)")
    return target, draft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/draft_layers")
    args = parser.parse_args()
    target, draft = fetched_pair()
    source = Path(__file__).resolve().parents[2] / "speclm/data/coding_prompts.jsonl"
    prompts = [json.loads(line)["turns"][0] for line in source.read_text().splitlines()[:PROMPTS]]
    # every run reads its prompt afresh: the memo's caches hold all 24 layers
    draft_model.PromptMemo.restore = lambda self, keys, cache: 0
    draft_model.PromptMemo.remember = lambda self, keys, cache: None
    fresh = draft_model.DraftModelProposer.fresh
    llm = LLM(model=target, threads=2, spec=f"draft:{draft}")
    llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=8))
    runs: dict[str, list[dict]] = {str(n): [] for n in LAYERS}
    texts: dict[str, list] = {}
    for _ in range(ROUNDS):
        for i, prompt in enumerate(prompts):
            for n in LAYERS:

                def with_layers(self, _n=n):
                    other = fresh(self)
                    other.num_layers = _n
                    return other

                draft_model.DraftModelProposer.fresh = with_layers
                t0 = time.perf_counter()
                out = llm.chat(
                    [{"role": "user", "content": prompt}], SamplingParams(max_tokens=TOKENS, ignore_eos=True)
                )
                seconds = time.perf_counter() - t0
                s = out.stats
                runs[str(n)].append({"prompt": i, "tokens_per_s": TOKENS / seconds, "accepted": s.accepted_tokens,
                                     "drafted": s.drafted_tokens, "steps": s.decode_steps})  # fmt: skip
                texts.setdefault(str(i), []).append(out.token_ids)
    draft_model.DraftModelProposer.fresh = fresh
    full = runs["None"]
    rows = []
    for n, rs in runs.items():
        rows.append({
            "layers": 24 if n == "None" else int(n),
            "tokens_per_s": TOKENS * len(rs) / sum(TOKENS / r["tokens_per_s"] for r in rs),
            "acceptance": sum(r["accepted"] for r in rs) / sum(r["drafted"] for r in rs),
            "median_ratio_vs_24": statistics.median(r["tokens_per_s"] / f["tokens_per_s"] for r, f in zip(rs, full)),
        })  # fmt: skip
    same = all(all(t == ts[0] for t in ts) for ts in texts.values())
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/draft_layers/draft_layers.py --out " + args.out
    result = {"command": command, "machine": machine_info(), "rows": rows, "outputs_equal": same, "runs": runs}
    (out_dir / "draft_layers.json").write_text(json.dumps(result, indent=1))
    m = result["machine"]
    md = [
        "# The draft with its last layers skipped: qwen2.5-coder-0.5b (24 layers) drafting for the 1.5B target", "",
        f"Command: `{command}`", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} (2 threads)", "",
        f"{PROMPTS} code prompts (speclm/data/coding_prompts.jsonl), {TOKENS} tokens, greedy, EOS ignored, "
        f"{ROUNDS} rounds, the layer counts interleaved per prompt. Outputs equal across layer counts: "
        + ("yes" if same else "NO"), "",
        "| draft layers | tokens/s | acceptance | median per-prompt ratio vs 24 |", "|---:|---:|---:|---:|",
    ]  # fmt: skip
    md += [
        f"| {r['layers']} | {r['tokens_per_s']:.1f} | {r['acceptance']:.3f} | {r['median_ratio_vs_24']:.3f}x |"
        for r in rows
    ]
    (out_dir / "draft_layers.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
