"""`speclm bench`: speed and acceptance of decoding methods per prompt category, plus peers."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from speclm.bench.llama_cli import PEERS as LLAMA_PEERS
from speclm.bench.llama_cli import LlamaCliPeer
from speclm.cli.common import add_model_args, load_llm, split_methods
from speclm.cli.serve import add_cache_args
from speclm.config import DEFAULT_K, SpecConfig
from speclm.data import SPECBENCH_PROMPTS

DEFAULT_PROMPTS = SPECBENCH_PROMPTS


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark decoding methods (and peers) on a prompt set, or serving (`speclm bench serve`)",
        description="Default mode (spec): run each method over the same prompts (interleaved per prompt), then "
        "print and write JSON + markdown + PNG with tokens/s, speedup over AR in the same run, tau (tokens per "
        "target pass), acceptance rate and per-position acceptance, per category and overall. "
        "`speclm bench serve`: start a `speclm serve` process per method (and each --peers server) and measure "
        "throughput and TTFT / inter-token latency p50/p99 at each --concurrency level, the servers up together "
        "and the requests sent in rounds of C, each round to every server in turn (JSON + markdown, default "
        "name serve).",
    )
    p.add_argument(
        "mode",
        nargs="?",
        choices=["spec", "serve", "kv", "tree"],
        default="spec",
        help="spec (default): decoding methods; serve: the batched HTTP server; "
        "kv: int8 vs full-precision KV cache (memory, greedy agreement, speed); "
        "tree: cost of a token-tree verification pass vs a one-token pass, by node count",
    )
    add_model_args(p)
    p.add_argument(
        "--prompts",
        default=DEFAULT_PROMPTS,
        help="Spec-Bench style JSONL (default: the Spec-Bench dev prompts shipped with speclm)",
    )
    p.add_argument(
        "--methods",
        default="ar,ngram",
        help="comma-separated: ar, ngram, ngram:MAX_N, layerskip:N, draft:PATH, medusa:PATH[,width=W], "
        "eagle:PATH[,topk=T,beam=B,depth=D] (a key=value item is an option of the method before it; a method "
        "ending in @K runs a fixed K, e.g. draft:PATH@4; default ar,ngram)",
    )
    p.add_argument("--per-category", type=int, default=5, help="prompts per category (default 5; 0 = all)")
    p.add_argument("--categories", default=None, help="comma-separated categories to keep (default all)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--k",
        type=int,
        default=None,
        help="draft tokens per step, the maximum when adaptive (default 8 for draft:PATH,stop=P, 4 otherwise)",
    )
    p.add_argument("--no-adaptive", action="store_true", help="fixed K instead of adaptive speculation length")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--no-chat", action="store_true", help="feed prompts raw instead of through the chat template")
    p.add_argument(
        "--peers",
        default="",
        help="comma-separated peers to time in the same run, prompt by prompt: llama.cpp (plain decoding), "
        "llama-speculative (with the draft of the first draft:PATH method), llama-lookup (prompt lookup), "
        "transformers (fp32 generate), transformers-assisted (assistant_model = that draft); the llama ones need "
        "--llama-bin (with --compare: llama.cpp,transformers through llama-cpp-python). bench serve: llama-server "
        "(plain), llama-server:draft (-md with that draft), llama-server:TYPE (--spec-type TYPE, e.g. ngram-simple, "
        "ngram-mod), started per concurrency level with one slot per client",
    )
    p.add_argument(
        "--llama-bin",
        default=os.environ.get("LLAMA_CPP_BIN"),
        help="folder with llama.cpp's llama-completion, llama-speculative, llama-lookup and llama-server programs "
        "(default $LLAMA_CPP_BIN; docs/benchmarks.md says how to build them)",
    )
    g = p.add_argument_group("--compare: weight formats and peers in one run")
    g.add_argument(
        "--compare",
        action="store_true",
        help="time speclm in each --formats (AR and --spec-method) against llama.cpp (llama-cpp-python) "
        "and transformers (AR and prompt lookup) on the same GGUF, prompts and greedy token count; report "
        "medians, ratios to llama.cpp AR, greedy agreement with fp32, perplexity, verification cost, profile",
    )
    g.add_argument(
        "--formats", default="fp32,bf16,int8,int4", help="weight formats for --compare (default fp32,bf16,int8,int4)"
    )
    g.add_argument("--spec-method", default="ngram", help="speculative method for --compare (default ngram)")
    g.add_argument("--repeats", type=int, default=3, help="repeats for --compare (default 3)")
    g.add_argument(
        "--rss", action="store_true", help="with --compare: also measure each engine's peak RSS in a fresh process"
    )
    p.add_argument("--out", default="benchmarks", help="output directory (default benchmarks/)")
    p.add_argument("--name", default=None, help="output file stem (default spec_bench, or serve)")
    g = p.add_argument_group("bench serve")
    g.add_argument("--concurrency", default="1,4,16,32", help="comma-separated client counts (default 1,4,16,32)")
    g.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests per level (default 0: every prompt once, and at least 2 x concurrency)",
    )
    g.add_argument(
        "--compare-inprocess",
        action="store_true",
        help="also run the prompts in-process (LLM.generate on the loading thread, then on another thread) and "
        "report the server at concurrency 1 against them; each prompt once per level unless --requests",
    )
    g = p.add_argument_group("bench tree")
    g.add_argument("--nodes", default="1,2,4,8,16", help="comma-separated draft-node counts (default 1,2,4,8,16)")
    g.add_argument("--context", type=int, default=256, help="tokens in the KV cache before each pass (default 256)")
    g.add_argument("--rounds", type=int, default=20, help="timing rounds (default 20)")
    add_cache_args(p)
    p.set_defaults(run=run)


def first_draft(methods: list[str]) -> str | None:
    """The model of the first draft:PATH[,options] method (what the speculative peers draft with)."""
    from speclm.bench.spec_bench import parse_method

    specs = [parse_method(m, 1, False)[0] for m in methods if m.startswith("draft:")]
    drafts = [s.split(":", 1)[1].split(",")[0] for s in specs]
    return drafts[0] if drafts else None


def llama_peer(name: str, model_path: str, methods: list[str], args: argparse.Namespace):
    """A llama.cpp program on the same model; llama-speculative takes the first draft:PATH method's model
    and --k as its maximum draft length."""
    threads = args.threads or os.cpu_count() or 1
    return LlamaCliPeer(name, args.llama_bin, model_path, threads, first_draft(methods), args.k or DEFAULT_K)


TRANSFORMERS_PEERS = ["transformers", "transformers-assisted"]


def transformers_peer(name: str, llm, methods: list[str], args: argparse.Namespace):
    """transformers' greedy generate (fp32) on the same file; -assisted with the first draft:PATH method's
    model as its assistant_model, starting at --k drafts."""
    from speclm.bench.peers import TransformersBenchPeer, TransformersPeer

    def decode(ids: list[int]) -> str:
        return llm.tokenizer.decode(ids, skip_special_tokens=False)

    print(f"loading peer {name} (transformers, fp32) ...", file=sys.stderr)
    assistant = first_draft(methods) if name == "transformers-assisted" else None
    return TransformersBenchPeer(
        TransformersPeer(llm.model_path, assistant=assistant, assistant_tokens=args.k or DEFAULT_K), decode
    )


def run(args: argparse.Namespace) -> int:
    if args.mode == "serve":
        from speclm.cli.bench_serve import run_serve

        return run_serve(args)
    if args.mode == "kv":
        from speclm.cli.bench_serve import run_kv

        return run_kv(args)
    if args.mode == "tree":
        from speclm.bench.tree_cost import parse_sizes, run_tree

        sizes = parse_sizes(args)  # before the slow model load
        args.spec = None
        return run_tree(load_llm(args), sizes, args)
    args.name = args.name or "spec_bench"
    from speclm.bench.machine import machine_info
    from speclm.bench.report import markdown_table, output_paths, plot_speedups, pyplot, write_json
    from speclm.bench.spec_bench import aggregate, parse_method, run_methods
    from speclm.data import load_prompts
    from speclm.sampling_params import SamplingParams

    if args.compare:
        from speclm.bench.compare_report import write_compare

        categories = args.categories.split(",") if args.categories else None
        if args.name == "spec_bench":
            args.name = "runtime"
        return write_compare(args, load_prompts(args.prompts, args.per_category or None, categories))
    methods = split_methods(args.methods)
    if not methods:
        raise ValueError("--methods is empty")
    if "ar" not in methods:
        methods.insert(0, "ar")  # speedups are always relative to AR in the same run
    methods.remove("ar")
    methods.insert(0, "ar")
    for method in methods[1:]:
        SpecConfig.parse(*parse_method(method, args.k, not args.no_adaptive))  # fails before the slow load
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in TRANSFORMERS_PEERS and peer not in LLAMA_PEERS:
            supported = ", ".join([*TRANSFORMERS_PEERS, *LLAMA_PEERS])
            raise ValueError(f"unknown peer {peer!r} (supported: {supported})")
    if any(p in ("llama-speculative", "transformers-assisted") for p in peers) and not first_draft(methods):
        raise ValueError("peers llama-speculative and transformers-assisted need a draft:PATH method (their draft)")
    if any(p in LLAMA_PEERS for p in peers) and not (args.llama_bin and os.path.isdir(args.llama_bin)):
        raise ValueError(f"llama.cpp peers need --llama-bin DIR (or $LLAMA_CPP_BIN), got {args.llama_bin!r}")
    params = SamplingParams(
        temperature=args.temperature,
        seed=args.seed,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos or bool(peers),
    )
    categories = args.categories.split(",") if args.categories else None
    prompts = load_prompts(args.prompts, args.per_category or None, categories)
    args.spec = None
    pyplot()  # the plot needs the `bench` extra: say so before the slow load and run, not after
    llm = load_llm(args)
    bench_peers = [llama_peer(name, llm.model_path, methods, args) for name in LLAMA_PEERS if name in peers]
    bench_peers += [transformers_peer(name, llm, methods, args) for name in TRANSFORMERS_PEERS if name in peers]
    records = run_methods(
        llm, prompts, methods, params, args.k, not args.no_adaptive, chat=not args.no_chat, peers=bench_peers
    )
    methods += [p.name for p in bench_peers]

    summary = aggregate(records)
    machine = machine_info()
    command = (
        "speclm bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["bench"]
        else "speclm bench"
    )
    title = (
        f"speclm bench: {os.path.basename(llm.model_path)}, temperature {args.temperature}, {args.max_tokens} tokens"
    )
    paths = output_paths(args.out, args.name)
    write_json(
        paths["json"],
        {
            "command": command,
            "machine": machine,
            "methods": methods,
            "params": vars(params),
            "k": args.k,
            "adaptive": not args.no_adaptive,
            "summary": summary,
            "records": records,
        },
    )
    table = markdown_table(summary, methods, title, command, machine, greedy=args.temperature == 0)
    with open(paths["md"], "w") as f:
        f.write(table)
    plot_speedups(paths["png"], summary, methods, title)
    print(table)
    print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}", file=sys.stderr)
    return 0
