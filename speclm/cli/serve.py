"""`speclm serve`: the OpenAI-compatible HTTP server over the batched engine."""

from __future__ import annotations

import argparse
import sys

from speclm.cli.common import add_eviction_args, add_model_args, add_spec_args, eviction_options, load_llm


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """Paged KV cache and scheduler options (shared with `speclm bench serve`)."""
    from speclm.config import CacheConfig

    d = CacheConfig()
    g = p.add_argument_group("batching and KV cache")
    g.add_argument("--block-size", type=int, default=d.block_size, help=f"tokens per KV block (default {d.block_size})")
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks in the pool (default: from --kv-cache-mb)")
    g.add_argument(
        "--kv-cache-mb",
        type=float,
        default=d.kv_cache_mb,
        help=f"memory for the KV pool when --num-blocks is not given (default {d.kv_cache_mb:g})",
    )
    g.add_argument(
        "--max-num-seqs", type=int, default=d.max_num_seqs, help=f"sequences running at once (default {d.max_num_seqs})"
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=d.max_num_batched_tokens,
        help=f"tokens per engine step; longer prompts are prefilled in chunks (default {d.max_num_batched_tokens})",
    )
    g.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "int8"],
        default="auto",
        help="auto: the model's dtype; int8: ~3.8x smaller cache, small quality cost (default auto)",
    )
    g.add_argument(
        "--streaming-window",
        type=int,
        default=None,
        metavar="TOKENS",
        help="StreamingLLM: keep only this many tokens of KV per sequence (attention sinks + most recent), "
        "so generation can outgrow the cache (default off; the same as --kv-eviction streaming --kv-budget TOKENS)",
    )
    add_eviction_args(g)
    g.add_argument("--no-prefix-caching", action="store_true", help="do not reuse KV blocks of shared prompt prefixes")


def cache_config(args: argparse.Namespace):
    from speclm.config import CacheConfig

    return CacheConfig(
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        kv_cache_mb=args.kv_cache_mb,
        enable_prefix_caching=not args.no_prefix_caching,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_dtype=args.kv_cache_dtype,
        streaming_window=args.streaming_window,
        **eviction_options(args),
    )


def add_server_args(p: argparse.ArgumentParser) -> None:
    from speclm.server.config import ServerConfig

    d = ServerConfig()
    g = p.add_argument_group("HTTP server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/ endpoints and /metrics (/health stays open)",
    )
    g.add_argument("--metrics-open", action="store_true", help="serve /metrics without the API key")
    g.add_argument(
        "--served-model-name",
        default=None,
        help="model id /v1/models lists (default: the model file's name); requests naming another "
        "model are served by this one",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help=f"larger request bodies get 413 (default {d.max_body_bytes})",
    )
    g.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="longer prompts get 400 (default: whatever fits the model's context)",
    )
    g.add_argument("--max-n", type=int, default=d.max_n, help=f"most samples per request (default {d.max_n})")
    g.add_argument(
        "--max-stop", type=int, default=d.max_stop, help=f"most stop strings per request (default {d.max_stop})"
    )
    g.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=d.max_concurrent_requests,
        help=f"generation requests in flight at once; more get 429 (default {d.max_concurrent_requests})",
    )
    g.add_argument(
        "--drain-seconds",
        type=float,
        default=d.drain_seconds,
        help=f"on SIGTERM, time in-flight requests get to finish before they are cancelled "
        f"(default {d.drain_seconds:g})",
    )


def server_config(args: argparse.Namespace, model_name: str):
    from speclm.server.config import ServerConfig

    return ServerConfig(
        model_name=model_name,
        api_key=args.api_key,
        metrics_open=args.metrics_open,
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_n=args.max_n,
        max_stop=args.max_stop,
        max_concurrent_requests=args.max_concurrent_requests,
        drain_seconds=args.drain_seconds,
    )


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API",
        description="Continuous batching over a paged KV cache with prefix caching. Endpoints: /v1/models, "
        "/v1/completions, /v1/chat/completions (SSE streaming), /health, /metrics (Prometheus). A request that "
        "fails inside the engine fails alone; if the engine loop itself dies the server exits with status 1.",
    )
    add_model_args(p)
    add_server_args(p)
    add_spec_args(p)
    p.add_argument(
        "--spec-max-batch",
        type=int,
        default=None,
        help="propose drafts only in steps with at most this many sequences, running or waiting to be admitted "
        "(default: 1 for draft: on a CPU, where a draft model's per-sequence passes stop paying in a batch; "
        "8 otherwise)",
    )
    add_cache_args(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from speclm.server.app import build_app, served_model_name
    from speclm.server.launch import serve_here

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    cache = cache_config(args)  # validate before the slow model load
    server = server_config(args, args.served_model_name or "")
    llm = load_llm(args, cache, args.spec_max_batch)  # its engine is the one served
    server.model_name = args.served_model_name or served_model_name(llm.model_path)

    def on_fatal(error: BaseException) -> None:  # the engine loop died: serve_here stops serving, exit non-zero
        print(f"speclm serve: error: the engine loop died ({error!r}); shutting down", file=sys.stderr)

    app = build_app(llm, server=server, on_fatal=on_fatal)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=server.drain_seconds
    )

    def on_listening(url: str) -> None:  # printed once the socket accepts connections
        print(
            f"speclm serve: {llm.engine.num_kv_blocks} KV blocks of {cache.block_size} tokens; listening on {url}",
            file=sys.stderr,
        )

    # The engine runs on this thread, which loaded the model; uvicorn on another (speclm/server/launch.py).
    if not serve_here(app, config, on_listening, handle_signals=True):
        print(f"speclm serve: error: could not serve on {args.host}:{args.port}", file=sys.stderr)
        return 1
    return 1 if app.state.engine.fatal is not None else 0
