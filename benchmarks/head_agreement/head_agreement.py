"""EAGLE heads' first-draft agreement with the target on the benchmark's own prompts, per category
(`python benchmarks/head_agreement/head_agreement.py --heads drafters/eagle-smollm2-135m`; writes
benchmarks/head_agreement/eagle_agreement.{json,md}).

The target answers each prompt greedily (cached like drafter training data, under --data-dir). The
head then reads the target's true features and tokens of those answers (teacher forcing) and proposes
its top token for every response position; a row agrees when that is the target's own greedy token,
over the full vocabulary. That is the acceptance rate of a greedy first draft, without the engine's
timing noise. `coverage` is the share of the target's tokens inside the head's token map, a ceiling
on agreement. Training-time validation (`speclm distill --val-fraction`) scores unseen answers to the
*training* prompt pool instead, inside the token map.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict

import torch

from speclm.bench.machine import machine_info
from speclm.bench.report import write_json
from speclm.data import SPECBENCH_PROMPTS, load_prompts
from speclm.distill.data import DataSettings, TargetData, load_or_build
from speclm.distill.objectives import EagleObjective
from speclm.models.attention import AttentionMetadata
from speclm.speculative.heads import EagleHead, load_head

DEFAULT_PROMPTS = SPECBENCH_PROMPTS


@torch.inference_mode()
def first_draft_agreement(
    head: EagleHead, embed: torch.Tensor, output_head: torch.Tensor, data: TargetData, categories: list[str]
) -> dict[str, dict[str, float]]:
    """Per category (and 'overall'): scored rows, agreement and token-map coverage. embed and
    output_head are the target's fp32 [vocab, hidden] matrices; categories[i] is sequence i's."""
    token_map = head.token_map
    inside = torch.ones(output_head.shape[0], dtype=torch.bool)
    if token_map is not None:
        inside = torch.zeros_like(inside)
        inside[token_map] = True
    draft_head = output_head if token_map is None else output_head[token_map]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # rows, agreeing, inside the map
    for i, category in enumerate(categories):
        tokens, features, prompt_len = data.sequence(i)
        n = tokens.numel()
        rows = EagleObjective._first_pass_rows(n, prompt_len)  # row t predicts token t+2, a response token
        if not rows.any():
            continue
        predicted = head(
            features[:-1], embed[tokens[1:]], torch.arange(1, n), head.new_cache(n - 1), AttentionMetadata(0, n - 1)
        )
        proposal = (predicted[rows] @ draft_head.T).argmax(-1)
        if token_map is not None:
            proposal = token_map[proposal]
        target = (features[1:][rows] @ output_head.T).argmax(-1)  # the target's greedy token t+2
        for key in (category, "overall"):
            counts[key][0] += int(rows.sum())
            counts[key][1] += int((proposal == target).sum())
            counts[key][2] += int(inside[target].sum())
    return {key: {"rows": r, "agreement": a / r, "coverage": m / r} for key, (r, a, m) in counts.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", required=True, help="comma-separated EAGLE head directories")
    p.add_argument("--prompts", default=DEFAULT_PROMPTS, help="Spec-Bench style JSONL")
    p.add_argument("--per-category", type=int, default=3, help="prompts per category (the benchmark's first ones)")
    p.add_argument("--weights", default="int4", help="the target's runtime format (what the heads were trained on)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data-dir", default=".cache/bench_agreement", help="where the target's answers are cached")
    p.add_argument("--out", default="benchmarks/head_agreement")
    p.add_argument("--name", default="eagle_agreement")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from speclm.llm import LLM
    from speclm.models.loader import load_checkpoint

    llm = LLM(weights=args.weights)
    heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    loaded = {h: load_head(h, llm.model.config) for h in heads}
    for path, head in loaded.items():
        if not isinstance(head, EagleHead):
            raise SystemExit(f"{path} is a {head.kind} head; this benchmark scores EAGLE heads")
    settings = DataSettings()
    prompts = [
        q
        for q in load_prompts(args.prompts, per_category=args.per_category)
        if len(llm.tokenizer.encode_chat([{"role": "user", "content": q["text"]}])) <= settings.max_prompt_tokens
    ]
    data, _ = load_or_build(llm, args.weights, [q["text"] for q in prompts], settings, args.data_dir)
    tensors = load_checkpoint(llm.model_path).tensors
    embed = tensors["model.embed_tokens.weight"].float()
    output_head = embed if llm.model.config.tie_word_embeddings else tensors["lm_head.weight"].float()
    results = {
        h: first_draft_agreement(loaded[h].float(), embed, output_head, data, [q["category"] for q in prompts])
        for h in heads
    }

    command = (
        f"python benchmarks/head_agreement/head_agreement.py --heads {args.heads} --per-category {args.per_category} "
        f"--weights {args.weights} --threads {args.threads} --name {args.name}"
    )
    machine = machine_info()
    write_json(
        os.path.join(args.out, f"{args.name}.json"),
        {"command": command, "machine": machine, "prompts": len(prompts), "results": results},
    )
    lines = [
        f"# EAGLE first-draft agreement on the benchmark's prompts ({len(prompts)} of {args.prompts}, "
        f"{args.per_category} per category, prompts over {settings.max_prompt_tokens} tokens left out)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu')}, torch {machine.get('torch')}.",
        "",
        "Teacher-forced over the target's greedy answers: a row agrees when the head's top token is the "
        "target's greedy token (full vocabulary); coverage is the share of the target's tokens inside the "
        "head's token map.",
        "",
        "| head | category | rows | agreement | coverage |",
        "|---|---|---:|---:|---:|",
    ]
    for h in heads:
        for key in sorted(results[h], key=lambda k: (k == "overall", k)):
            r = results[h][key]
            label = f"**{key}**" if key == "overall" else key
            lines.append(f"| {h} | {label} | {r['rows']} | {r['agreement']:.3f} | {r['coverage']:.3f} |")
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
