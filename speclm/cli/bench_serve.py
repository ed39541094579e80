"""`speclm bench serve`: serving throughput and latency per concurrency level (see speclm/bench/serve_bench.py)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shlex
import sys

from speclm.cli.common import add_model_args, load_llm, split_methods
from speclm.cli.serve import add_cache_args
from speclm.config import SpecConfig

NOTE = (
    "Absolute numbers depend on what else the machine runs (this tool does not check); ratios between "
    "servers and levels of the same run are the meaningful part."
)


def run_serve(args: argparse.Namespace) -> int:
    from speclm.bench.machine import machine_info
    from speclm.bench.report import output_paths, write_json
    from speclm.bench.serve_bench import (
        InProcessRuns,
        inprocess_markdown,
        markdown,
        mismatches,
        run_levels,
        time_in_process,
    )
    from speclm.bench.serve_categories import anatomy, anatomy_markdown, category_markdown, category_results
    from speclm.bench.speclm_server import SpeclmServer
    from speclm.cli.serve import cache_config

    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError as e:
        raise ValueError(f"--concurrency must be comma-separated integers, got {args.concurrency!r}") from e
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency needs levels >= 1, got {args.concurrency!r}")
    if args.requests < 0 or args.max_tokens < 1:
        raise ValueError(f"--requests must be >= 0 and --max-tokens >= 1, got {args.requests}, {args.max_tokens}")
    if args.compare_inprocess and 1 not in levels:
        levels = [1, *levels]
    config = cache_config(args)
    if max(levels) > config.max_num_seqs:
        print(f"note: concurrency above --max-num-seqs {config.max_num_seqs} queues requests", file=sys.stderr)
    methods = split_methods(args.methods) or ["ar"]  # keeps "eagle:DIR,topk=1" together
    if args.compare_inprocess:
        llm, prompts, categories = load_llm_and_prompts(args)
        model_path, context_length = llm.model_path, llm.model.config.max_position_embeddings
    else:  # the servers load the model: this process only reads its config and tokenizes the prompts
        from speclm.models.loader import load_checkpoint
        from speclm.tokenizer import load_tokenizer

        selected = selected_prompts(args)
        checkpoint = load_checkpoint(args.model)  # (a GGUF's tensors stay unread)
        model_path, context_length = checkpoint.source, checkpoint.config.max_position_embeddings
        prompts = tokenized(args, load_tokenizer(model_path, args.tokenizer), selected)
        categories = [p["category"] for p in selected]
    room = context_length - args.max_tokens
    if room < 1:
        raise ValueError(f"--max-tokens {args.max_tokens} leaves no room for a prompt in the model's context")
    prompts = [p[-room:] for p in prompts]  # keep the end of over-long prompts (tiny-context models)
    peers = serve_peers(args, model_path, methods)

    def num_requests(c: int) -> int:  # by default every prompt at least once per level (the per-category table)
        return args.requests or (len(prompts) if args.compare_inprocess else max(len(prompts), 2 * c))

    options = serve_options(args)
    servers, inprocess, served_llms = [], {}, {}
    for method in methods:
        spec = None if method == "ar" else method
        k = None if spec is None else SpecConfig.parse(method, args.k).max_k
        label = "no speculation" if spec is None else f"{method} (K={k}{'' if args.no_adaptive else ', adaptive'})"
        servers.append(SpeclmServer(label, options, spec, args.k, not args.no_adaptive))
        if args.compare_inprocess:  # on this thread, which loaded the model, as the server's engine runs
            served_llms[label] = llm if spec is None else llm.with_spec(method, args.k, not args.no_adaptive)
    runs = {label: InProcessRuns(served, args.max_tokens) for label, served in served_llms.items()}
    turns = itertools.count()

    def in_process_turn(_level: int, ids: list[int]) -> None:
        """At concurrency 1, the in-process engines run the round's request first, their order rotating,
        while the servers are idle: the same moment's machine as the servers' requests."""
        labels = list(runs)
        turn = next(turns) % len(labels)
        for label in labels[turn:] + labels[:turn]:
            for i in ids:
                runs[label].run(prompts[i % len(prompts)])

    context = max(len(p) for p in prompts) + args.max_tokens + 16
    results: dict[str, list[dict]] = {}
    for c in levels:  # every server up at once (a peer with one slot per client), the requests interleaved
        with contextlib.ExitStack() as up:
            urls = {server.name: up.enter_context(server.serving(c, context)) for server in servers}
            for peer in list(peers):
                try:
                    urls[peer.name] = up.enter_context(peer.serving(c, context))
                except RuntimeError as e:  # a peer that does not start is reported and left out; speclm's rows stand
                    print(f"peer {peer.name} failed, left out: {e}", file=sys.stderr)
                    results.pop(peer.name, None)
                    peers.remove(peer)
            turn = in_process_turn if runs and c == 1 else None
            for label, rows in run_levels(urls, prompts, [(c, num_requests(c))], args.max_tokens, turn).items():
                r = rows[0]
                results.setdefault(label, []).append(r)
                print(
                    f"{label}, concurrency {c}: {r['tokens_per_s']:.1f} tokens/s, "
                    f"TTFT p50 {r['ttft_p50']:.3f} s, ITL p50 {1000 * r['itl_p50']:.1f} ms",
                    file=sys.stderr,
                )
    inprocess = {label: r.summary() for label, r in runs.items()}
    reference = results.get("no speculation") or next(iter(results.values()))
    for rows in results.values():  # greedy text against speclm's AR (or the first method), request by request
        for r, ref in zip(rows, reference):
            r["mismatches"] = mismatches(r["texts"], ref["texts"])
    for label, r in inprocess.items():
        server = next(row for row in results[label] if row["concurrency"] == 1)
        r["server_tokens_per_s"] = server["tokens_per_s"]
        r["server_vs_inprocess"] = server["tokens_per_s"] / r["tokens_per_s"]
        r["server_mismatches"] = mismatches(server["texts"], r["texts"])  # (request i asks prompt i mod the prompts)
    requested = [prompts[i % len(prompts)] for i in range(num_requests(1))]
    for label, r in inprocess.items():  # last: a second OpenMP team in this process could slow what follows
        other = time_in_process(served_llms[label], requested, args.max_tokens, on_thread=True)
        r["other_thread_tokens_per_s"] = other["tokens_per_s"]
        r["other_thread_mismatches"] = mismatches(other["texts"], r["texts"])
    for rows in [*results.values(), inprocess.values()]:
        for r in rows:
            r.pop("texts", None)
    per_category = category_results(results, inprocess, categories, [server.name for server in servers])
    made_of = anatomy(inprocess, categories)
    machine = machine_info()
    command = (
        "speclm bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else "speclm bench serve"
    )
    title = f"speclm bench serve: {os.path.basename(model_path)}, greedy, {args.max_tokens} tokens per request"
    paths = output_paths(args.out, args.name or "serve")
    write_json(
        paths["json"],
        {
            "command": command,
            "machine": machine,
            "note": NOTE,
            "cache": vars(config),
            "max_tokens": args.max_tokens,
            "prompts": len(prompts),
            "categories_of_prompts": categories,
            "results": results,
            "inprocess": inprocess,
            "per_category": {str(c): cells for c, cells in per_category.items()},
            "inprocess_anatomy": made_of,
        },
    )
    table = markdown(results, title, command, machine, NOTE)
    if inprocess:
        table += "\n".join(inprocess_markdown(inprocess)) + "\n"
    table += "\n".join(category_markdown(per_category)) + "\n"
    if made_of:
        table += "\n".join(anatomy_markdown(made_of)) + "\n"
    with open(paths["md"], "w") as f:
        f.write(table)
    print(table)
    print(f"wrote {paths['json']}, {paths['md']}", file=sys.stderr)
    return 0


def serve_options(args: argparse.Namespace) -> list[str]:
    """The benchmark's model and cache options that are not at their defaults, as `speclm serve` arguments
    (both commands declare them with the same functions)."""
    declared = argparse.ArgumentParser(add_help=False)
    add_model_args(declared)
    add_cache_args(declared)
    argv: list[str] = []
    for action in declared._actions:
        value = getattr(args, action.dest, action.default)
        if not action.option_strings or value == action.default:
            continue
        flag = next(o for o in action.option_strings if o.startswith("--"))
        argv += [flag] if action.nargs == 0 else [flag, str(value)]
    return argv


def serve_peers(args: argparse.Namespace, model_path: str, methods: list[str]) -> list:
    """The llama-server peers of --peers; one that cannot run here (no --llama-bin, no program) is skipped
    with a message."""
    from speclm.bench.llama_server import LlamaServerPeer
    from speclm.bench.spec_bench import parse_method

    specs = [parse_method(m, 1, False)[0] for m in methods if m.startswith("draft:")]
    draft = specs[0].split(":", 1)[1].split(",")[0] if specs else None  # the first draft:PATH method's model
    peers = []
    for name in [p.strip() for p in args.peers.split(",") if p.strip()]:
        try:
            peers.append(LlamaServerPeer(name, args.llama_bin, model_path, args.threads or os.cpu_count() or 1, draft))
        except ValueError as e:
            print(f"skipping peer {name}: {e}", file=sys.stderr)
    return peers


def run_kv(args: argparse.Namespace) -> int:
    """`speclm bench kv`: the same prompts through the batched engine with a full-precision and an int8
    KV cache; memory per token, greedy agreement with the full-precision output, and tokens/s."""
    import dataclasses
    import time

    from speclm.bench.machine import machine_info
    from speclm.bench.report import header_lines, output_paths, write_json
    from speclm.cli.serve import cache_config
    from speclm.engine.engine import Engine
    from speclm.engine.request import Request
    from speclm.sampling_params import SamplingParams

    config = cache_config(args)
    if config.token_eviction:
        raise ValueError(
            "bench kv compares int8 and streaming caches; for h2o and snapkv run "
            "python benchmarks/kv_eviction/kv_eviction.py"
        )
    window = config.streaming_window
    config = dataclasses.replace(config, streaming_window=None, kv_eviction=None, kv_budget=None)
    llm, prompts, _ = load_llm_and_prompts(args)
    room = llm.model.config.max_position_embeddings - args.max_tokens
    prompts = [p[-room:] for p in prompts]
    variants = {"auto": config, "int8": dataclasses.replace(config, kv_cache_dtype="int8")}
    if window is not None:
        variants[f"streaming {window}"] = dataclasses.replace(config, streaming_window=window)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    runner = llm.runner
    rows, outputs = {}, {}
    for dtype, variant in variants.items():
        engine = Engine(runner, llm.tokenizer, variant)
        t0 = time.perf_counter()
        outs = engine.generate([Request(str(i), p, params) for i, p in enumerate(prompts)])
        seconds = time.perf_counter() - t0
        outputs[dtype] = [o[0].token_ids for o in outs]
        per_token = runner.kv_bytes_per_token(dtype == "int8")
        longest = max(len(p) for p in prompts) + args.max_tokens
        kept = min(
            longest,
            -(-variant.streaming_window // variant.block_size) * variant.block_size
            if variant.streaming_window
            else longest,
        )
        rows[dtype] = {
            "kv_bytes_per_token": per_token,
            "cache_mb": engine.cache.nbytes / 2**20,
            "longest_sequence_kv_mb": kept * per_token / 2**20,
            "num_blocks": engine.block_manager.num_blocks,
            "tokens_per_s": len(prompts) * args.max_tokens / seconds,
        }
    for dtype, row in rows.items():
        agree = [
            next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), len(ref))
            for ref, out in zip(outputs["auto"], outputs[dtype])
        ]
        row["identical_outputs"] = sum(a == args.max_tokens for a in agree) / len(agree)
        row["mean_agreeing_prefix"] = sum(agree) / len(agree)
    machine = machine_info()
    command = (
        "speclm bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else "speclm bench kv"
    )
    title = f"speclm bench kv: {os.path.basename(llm.model_path)}, {len(prompts)} prompts, greedy, "
    title += f"{args.max_tokens} tokens each"
    lines = [
        *header_lines(title, command, machine, f". {NOTE}"),
        "Agreement: greedy tokens generated before the first difference from the full-precision cache's output.",
        "",
        "| KV cache | bytes/token | pool MB | KV MB of the longest sequence | identical outputs | "
        "mean agreeing prefix (tokens) | tokens/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, r in rows.items():
        lines.append(
            f"| {dtype} | {r['kv_bytes_per_token']} | {r['cache_mb']:.1f} | {r['longest_sequence_kv_mb']:.2f} | "
            f"{100 * r['identical_outputs']:.0f}% | "
            f"{r['mean_agreeing_prefix']:.1f} / {args.max_tokens} | {r['tokens_per_s']:.1f} |"
        )
    table = "\n".join(lines) + "\n"
    paths = output_paths(args.out, args.name or "kv_int8")
    write_json(
        paths["json"],
        {
            "command": command,
            "machine": machine,
            "note": NOTE,
            "cache": vars(config),
            "max_tokens": args.max_tokens,
            "results": rows,
        },
    )
    with open(paths["md"], "w") as f:
        f.write(table)
    print(table)
    return 0


def load_llm_and_prompts(args: argparse.Namespace):
    """The model (without speculation), the selected benchmark prompts as token ids and their categories."""
    selected = selected_prompts(args)  # (a bad prompt file fails before the slow load)
    args.spec = None
    llm = load_llm(args)
    return llm, tokenized(args, llm.tokenizer, selected), [p["category"] for p in selected]


def selected_prompts(args: argparse.Namespace) -> list[dict]:
    """The benchmark prompts --prompts, --per-category and --categories select."""
    from speclm.data import load_prompts

    wanted = args.categories.split(",") if args.categories else None
    return load_prompts(args.prompts, args.per_category or None, wanted)


def tokenized(args: argparse.Namespace, tokenizer, selected: list[dict]) -> list[list[int]]:
    """The prompts as token ids, chat-formatted unless --no-chat."""
    chat = not args.no_chat
    return [
        tokenizer.encode_chat([{"role": "user", "content": p["text"]}]) if chat else tokenizer.encode(p["text"])
        for p in selected
    ]
