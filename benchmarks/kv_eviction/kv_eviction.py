"""KV eviction on the default model: quality, memory and decode speed of StreamingLLM, H2O and SnapKV
against the full cache, at budgets that are fractions of each sequence.

python benchmarks/kv_eviction/kv_eviction.py [--budgets 0.1,0.25,0.5] [--haystacks 8] [--haystack-tokens 800]
    [--ppl-docs 1] [--ppl-prefix 200] [--ppl-tokens 800] [--speed-rounds 3] [--out benchmarks/kv_eviction/kv_eviction]

Perplexity: the longest Spec-Bench summarization articles (in the repository), each a prompt of
--ppl-prefix tokens and the rest of the article decoded token by token through the engine with the
evicting cache, its sampling replaced by the article's next token (teacher forcing): every scored token
is predicted from what the policy kept. Passkey retrieval: a 5-digit key hidden at a varied depth in
--haystack-tokens of filler, then asked for; greedy, 8 tokens, correct when the key appears. Decode
rate: greedy decoding after the whole first article, the caches taking turns. H2O and SnapKV prefill
a prompt whole and cut it before the first decoding step (so the first answer token still saw the
whole prompt); StreamingLLM evicts during prefill as well.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch

from speclm.bench.machine import machine_info
from speclm.bench.report import header_lines, output_paths, write_json
from speclm.config import CacheConfig
from speclm.data import SPECBENCH_PROMPTS
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from speclm.sampling_params import SamplingParams

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INTRO = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
QUESTION = "What is the pass key? The pass key is"
POLICIES = ("streaming", "h2o", "snapkv")


class TeacherForcedEngine(Engine):
    """The engine with its next-token choice replaced by a given text's next token: it records the
    negative log-likelihood of each and decodes exactly as generation would (eviction included)."""

    def __init__(self, *args, forced: list[int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.forced, self.nll = forced, []
        self.processor.draw = self._draw

    def _draw(self, state, rows) -> int:
        logits = rows.row(0)  # [vocab]
        token = self.forced[len(state.tracker.token_ids)]
        self.nll.append(-torch.log_softmax(logits.float(), -1)[token].item())
        return token


def cache_config(policy: str | None, fraction: float | None, sequence_tokens: int, block_size: int) -> CacheConfig:
    """The cache of one run: a budget of `fraction` of the sequence (the same token count for every policy);
    a policy without a fraction gets the whole sequence (it scores tokens but never evicts)."""
    if policy is None:
        return CacheConfig(block_size=block_size, max_num_seqs=1)
    if fraction is None:
        return CacheConfig(block_size=block_size, max_num_seqs=1, kv_eviction=policy, kv_budget=sequence_tokens)
    tokens = CacheConfig(block_size=block_size, kv_eviction="h2o", kv_budget=fraction).budget_tokens(sequence_tokens)
    return CacheConfig(block_size=block_size, max_num_seqs=1, kv_eviction=policy, kv_budget=tokens)


def run_one(engine: Engine, prompt: list[int], params: SamplingParams) -> tuple[dict, int]:
    """Generate one request step by step: (its output, the most KV blocks it held once decoding)."""
    engine.add_request(Request("r", prompt, params))
    output, peak = None, 0
    while engine.has_unfinished():
        for out in engine.step():
            output = out.output or output
        state = engine.sequences.get("r#0")
        if state is not None and len(state.seq.output_ids) > 1:  # decoding, past any cut of the prompt
            peak = max(peak, engine.block_manager.num_used_blocks)
    return output, peak


def perplexity_docs(llm, count: int, prefix: int, max_tokens: int) -> list[list[int]]:
    """The `count` longest Spec-Bench summarization articles, tokenized (at most prefix + max_tokens)."""
    with open(SPECBENCH_PROMPTS) as f:
        rows = [json.loads(line) for line in f]
    turns = sorted((t for r in rows if r["category"] == "summarization" for t in r["turns"]), key=len, reverse=True)
    return [llm.encode(t)[: prefix + max_tokens] for t in turns[:count]]


def haystacks(llm, count: int, tokens: int, seed: int = 0) -> list[tuple[list[int], str, float]]:
    """(prompt ids, passkey, depth) for `count` haystacks of about `tokens` tokens, depths spread over 5-95%."""
    rng = random.Random(seed)
    repeats = max(1, tokens // len(llm.tokenizer.encode(FILLER, add_bos=False)))
    out = []
    for i in range(count):
        key, depth = str(rng.randint(10000, 99999)), 0.05 + 0.9 * i / max(1, count - 1)
        at = round(depth * repeats)
        needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
        text = INTRO + FILLER * at + needle + FILLER * (repeats - at) + QUESTION
        out.append((llm.encode(text), key, depth))
    return out


def variants(budgets: list[float]) -> list[tuple[str | None, float | None]]:
    return [(None, None)] + [(p, b) for b in budgets for p in POLICIES]


def label(policy: str | None, fraction: float | None) -> str:
    return "full cache" if policy is None else f"{policy} {1.0 if fraction is None else fraction:.0%}"


def quality(llm, policy, fraction, docs, stacks, args) -> dict:
    """Perplexity (teacher-forced decoding), passkey accuracy and KV kept of one cache."""
    nll, ppl_blocks, full_blocks = [], [], []
    for doc in docs:
        prompt, forced = doc[: args.ppl_prefix], doc[args.ppl_prefix :]
        config = cache_config(policy, fraction, len(doc), args.block_size)
        engine = TeacherForcedEngine(llm.runner, llm.tokenizer, config, forced=forced)
        _, peak = run_one(engine, prompt, SamplingParams(max_tokens=len(forced), ignore_eos=True))
        nll += engine.nll
        ppl_blocks.append(peak)
        full_blocks.append(-(-len(doc) // args.block_size))
    correct, stack_blocks, stack_full = 0, [], []
    for prompt, key, _ in stacks:
        config = cache_config(policy, fraction, len(prompt) + 8, args.block_size)
        out, peak = run_one(Engine(llm.runner, llm.tokenizer, config), prompt, SamplingParams(max_tokens=8))
        correct += key in out.text
        stack_blocks.append(peak)
        stack_full.append(-(-(len(prompt) + 8) // args.block_size))
    return {
        "policy": policy or "full",
        "budget_fraction": fraction,
        "perplexity": float(torch.tensor(nll).mean().exp()),
        "scored_tokens": len(nll),
        "passkey_accuracy": correct / len(stacks),
        "kv_blocks_kept_fraction": sum(ppl_blocks) / sum(full_blocks),
        "passkey_kv_blocks_kept_fraction": sum(stack_blocks) / sum(stack_full),
        "peak_kv_mb_per_sequence": max(ppl_blocks) * args.block_size * llm.runner.kv_bytes_per_token() / 2**20,
    }


def decode_rates(llm, prompt: list[int], caches: list, args) -> dict[str, list[float]]:
    """Greedy decoding rate (tokens/s after prefill) of --speed-tokens tokens after `prompt`, per cache;
    the caches take turns for --speed-rounds rounds, so a busy spell of the machine hits them alike."""
    rates: dict[str, list[float]] = {label(p, f): [] for p, f in caches}
    params = SamplingParams(max_tokens=args.speed_tokens, ignore_eos=True)
    for _ in range(args.speed_rounds):
        for policy, fraction in caches:
            config = cache_config(policy, fraction, len(prompt) + args.speed_tokens, args.block_size)
            out, _ = run_one(Engine(llm.runner, llm.tokenizer, config), prompt, params)
            seconds = out.stats.seconds - out.stats.prefill_seconds
            rates[label(policy, fraction)].append((out.stats.completion_tokens - 1) / seconds)
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="0.1,0.25,0.5", help="budgets as fractions of each sequence")
    ap.add_argument("--haystacks", type=int, default=8, help="passkey prompts (default 8)")
    ap.add_argument("--haystack-tokens", type=int, default=800, help="filler tokens per haystack (default 800)")
    ap.add_argument("--ppl-docs", type=int, default=1, help="articles for perplexity (default 1)")
    ap.add_argument("--ppl-prefix", type=int, default=200, help="prompt tokens of each article (default 200)")
    ap.add_argument("--ppl-tokens", type=int, default=800, help="decoded (scored) tokens per article at most")
    ap.add_argument("--speed-tokens", type=int, default=64, help="tokens decoded after the whole first article")
    ap.add_argument("--speed-rounds", type=int, default=3, help="rounds of the decode-rate runs (median)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1: the machine is shared)")
    ap.add_argument("--out", default="benchmarks/kv_eviction/kv_eviction", help="output path without extension")
    args = ap.parse_args()
    from speclm.llm import LLM

    llm = LLM(threads=args.threads)
    budgets = [float(b) for b in args.budgets.split(",")]
    docs = perplexity_docs(llm, args.ppl_docs, args.ppl_prefix, args.ppl_tokens)
    stacks = haystacks(llm, args.haystacks, args.haystack_tokens)
    results = {}
    for policy, fraction in variants(budgets):
        t0 = time.perf_counter()
        r = results[label(policy, fraction)] = quality(llm, policy, fraction, docs, stacks, args)
        print(
            f"{label(policy, fraction):16s} ppl {r['perplexity']:7.3f}  passkey {r['passkey_accuracy']:.0%}  "
            f"kv kept {r['kv_blocks_kept_fraction']:.0%}  ({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
        )
    # ("h2o", None): the whole sequence as the budget: H2O's attention scores are computed but nothing is
    # evicted, so its decode rate against the full cache's is what the scores cost.
    results["h2o 100%"] = {"policy": "h2o", "budget_fraction": None}
    rates = decode_rates(llm, docs[0], [(None, None), ("h2o", None), *variants(budgets)[1:]], args)
    for name, runs in rates.items():
        results[name]["decode_tokens_per_s"] = statistics.median(runs)
        results[name]["decode_tokens_per_s_runs"] = runs
        print(f"{name:16s} decode {statistics.median(runs):.1f} tokens/s {runs}", file=sys.stderr)
    order = ["full cache", "h2o 100%"]  # the scoring cost next to the full cache
    results = {k: results[k] for k in order + [k for k in results if k not in order]}
    write_report(args, results, docs, stacks)
    return 0


def write_report(args, results: dict, docs: list[list[int]], stacks: list) -> None:
    out_dir, _, name = args.out.rpartition("/")
    paths = output_paths(out_dir or ".", name)
    command = "python benchmarks/kv_eviction/kv_eviction.py " + " ".join(sys.argv[1:])
    machine = machine_info()
    doc_lengths = [len(d) for d in docs]
    stack_lengths = [len(p) for p, _, _ in stacks]
    settings = {"doc_tokens": doc_lengths, "haystack_prompt_tokens": stack_lengths, **vars(args)}
    write_json(paths["json"], {"command": command, "machine": machine, "settings": settings, "results": results})
    full = results["full cache"]
    lines = [
        *header_lines(
            "KV eviction: StreamingLLM, H2O and SnapKV against the full cache (SmolLM2-135M-Instruct)",
            command,
            machine,
            ", shared with other jobs: decode rates are within-run ratios at best.",
        ),
        f"Perplexity: {len(docs)} Spec-Bench summarization articles ({', '.join(map(str, doc_lengths))} tokens), "
        f"the first {args.ppl_prefix} as the prompt, the rest decoded token by token through the evicting cache "
        f"(teacher forcing; {full['scored_tokens']} scored tokens). Passkey: {len(stacks)} haystacks of "
        f"{min(stack_lengths)}-{max(stack_lengths)} tokens, key depths 5-95%, greedy. Budget: a fraction of "
        "each sequence (prompt + decoded tokens), the same token count for every policy. KV kept: the most "
        "KV blocks a sequence held while decoding, over what the full cache holds at its end (perplexity "
        f"runs; passkey runs in brackets). Decode tokens/s: greedy decoding of {args.speed_tokens} tokens after "
        f"the whole article ({len(docs[0])} tokens; the budget is a fraction of prompt + those tokens), median of "
        f"{args.speed_rounds} rounds in which the caches take turns. h2o at 100% computes H2O's attention "
        "scores but evicts nothing: its rate against the full cache's is what the scores cost (runs without "
        "H2O or SnapKV never compute them).",
        "",
        "| cache | budget | perplexity | vs full | passkey accuracy | KV kept | KV memory saved | peak KV MB "
        "| decode tokens/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results.values():
        budget = "100%" if r["budget_fraction"] is None else f"{r['budget_fraction']:.0%}"
        rate = f"{r['decode_tokens_per_s']:.1f}"
        if "perplexity" not in r:  # H2O's scores without eviction: a decode rate only
            lines.append(f"| {r['policy']} | {budget} (scores only, no eviction) | - | - | - | - | - | - | {rate} |")
            continue
        lines.append(
            f"| {r['policy']} | {budget} | {r['perplexity']:.3f} | {r['perplexity'] / full['perplexity']:.3f}x | "
            f"{r['passkey_accuracy']:.0%} | {r['kv_blocks_kept_fraction']:.0%} "
            f"({r['passkey_kv_blocks_kept_fraction']:.0%}) | {1 - r['kv_blocks_kept_fraction']:.0%} | "
            f"{r['peak_kv_mb_per_sequence']:.1f} | {rate} |"
        )
    with open(paths["md"], "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
