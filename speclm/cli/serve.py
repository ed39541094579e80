"""`speclm serve`: the OpenAI-compatible HTTP server over the batched engine."""
from __future__ import annotations

import argparse
import os
import sys

from speclm.cli.common import add_model_args, add_spec_args, load_llm


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """Paged KV cache and scheduler options (shared with `speclm bench serve`)."""
    from speclm.config import CacheConfig

    d = CacheConfig()
    g = p.add_argument_group("batching and KV cache")
    g.add_argument("--block-size", type=int, default=d.block_size, help=f"tokens per KV block (default {d.block_size})")
    g.add_argument("--num-blocks", type=int, default=None, help="KV blocks in the pool (default: from --kv-cache-mb)")
    g.add_argument("--kv-cache-mb", type=float, default=d.kv_cache_mb,
                   help=f"memory for the KV pool when --num-blocks is not given (default {d.kv_cache_mb:g})")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help=f"sequences running at once (default {d.max_num_seqs})")
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help=f"tokens per engine step; longer prompts are prefilled in chunks (default {d.max_num_batched_tokens})")
    g.add_argument("--kv-cache-dtype", choices=["auto", "int8"], default="auto",
                   help="auto: the model's dtype; int8: ~3.8x smaller cache, small quality cost (default auto)")
    g.add_argument("--streaming-window", type=int, default=None, metavar="TOKENS",
                   help="StreamingLLM: keep only this many tokens of KV per sequence (attention sinks + most recent), "
                   "so generation can outgrow the cache (default off)")
    g.add_argument("--attention-sinks", type=int, default=d.attention_sinks,
                   help=f"StreamingLLM: first tokens always kept, rounded up to whole blocks (default {d.attention_sinks})")
    g.add_argument("--no-prefix-caching", action="store_true", help="do not reuse KV blocks of shared prompt prefixes")


def cache_config(args: argparse.Namespace):
    from speclm.config import CacheConfig

    return CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks, kv_cache_mb=args.kv_cache_mb,
                       enable_prefix_caching=not args.no_prefix_caching, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_dtype=args.kv_cache_dtype,
                       streaming_window=args.streaming_window, attention_sinks=args.attention_sinks)


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API",
        description="Continuous batching over a paged KV cache with prefix caching. Endpoints: /v1/models, "
        "/v1/completions, /v1/chat/completions (SSE streaming), /health, /metrics (Prometheus).",
    )
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ endpoints")
    p.add_argument("--served-model-name", default=None, help="model id clients use (default: the model file's name)")
    add_spec_args(p)
    p.add_argument("--spec-max-batch", type=int, default=8,
                   help="propose drafts only in steps with at most this many running sequences (default 8)")
    add_cache_args(p)
    p.set_defaults(run=run)


def served_model_name(model_path: str) -> str:
    return os.path.splitext(os.path.basename(os.path.normpath(model_path)))[0]


def build_app(llm, config, api_key: str | None = None, model_name: str | None = None, spec_max_batch: int = 8):
    """The FastAPI app serving `llm` (and its speculative config) with a batched engine; the engine
    thread runs with the app."""
    from speclm.engine.async_engine import AsyncEngine
    from speclm.engine.batch_engine import BatchEngine
    from speclm.engine.model_runner import ModelRunner
    from speclm.server.app import create_app

    engine = AsyncEngine(BatchEngine(ModelRunner(llm.model), llm.tokenizer, config, llm.spec, llm.new_proposer,
                                     spec_max_batch))
    return create_app(engine, llm.tokenizer, model_name or served_model_name(llm.model_path), api_key)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    config = cache_config(args)  # validate before the slow model load
    llm = load_llm(args)
    app = build_app(llm, config, args.api_key, args.served_model_name, args.spec_max_batch)
    print(f"speclm serve: {app.state.engine.engine.block_manager.num_blocks} KV blocks of {config.block_size} tokens; "
          f"listening on http://{args.host}:{args.port}", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
