"""`speclm deploy`: the draft, the target and the OpenAI-compatible coordinator as separate Ray Serve services."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from speclm.cli.common import add_model_args, refuse_gpu
from speclm.cli.serve import add_cache_args, add_server_args, cache_config, server_config

DESCRIPTION = (
    "Start a deployment on Ray Serve: a draft service (proposes K tokens for a sequence), a target service "
    "(runs each sequence to the end in speclm's engine, holding its KV cache and verifying the drafts) and a "
    "coordinator serving the same OpenAI-compatible API as `speclm serve` (/v1/completions, "
    "/v1/chat/completions, /v1/models, /health, /metrics). Greedy output equals `speclm serve --spec draft:D` "
    "token for token; sampling is exact. A draft replica that dies turns its sequences to plain decoding (no "
    "error to the client); a target replica that dies fails its requests with a clear error while new "
    "requests go to live replicas. Without --ray-address (or RAY_ADDRESS) a local Ray instance is started. "
    "Needs the optional extra: pip install 'speclm[deploy]'. See docs/deploy.md."
)


def register(sub) -> None:
    p = sub.add_parser("deploy", help="serve draft and target as separate Ray Serve services", description=DESCRIPTION)
    add_model_args(p)
    g = p.add_argument_group("deployment (environment defaults: MAX_DRAFT_TOKENS, DRAFT_ENDPOINT, TARGET_ENDPOINT)")
    g.add_argument("--draft", default=None, metavar="PATH", help="the draft model (default: none, plain decoding)")
    g.add_argument(
        "--draft-weights",
        default=None,
        metavar="FORMAT",
        help="runtime weight format of the draft (default q4_0, as --spec draft:PATH; never changes the output)",
    )
    g.add_argument("--draft-replicas", type=int, default=1, help="draft service replicas (default 1)")
    g.add_argument("--target-replicas", type=int, default=1, help="target service replicas (default 1)")
    g.add_argument(
        "--max-draft-tokens",
        type=int,
        default=None,
        help="K, draft tokens per step (the most when adaptive; default $MAX_DRAFT_TOKENS or 4)",
    )
    g.add_argument("--no-adaptive", action="store_true", help="always propose K tokens instead of adapting K")
    g.add_argument(
        "--draft-timeout",
        type=float,
        default=30.0,
        help="seconds the target waits on a draft call before decoding that sequence alone (default 30)",
    )
    g.add_argument(
        "--draft-endpoint",
        default=None,
        metavar="RESOURCE",
        help="Ray node resource of the machines that run the draft service (default $DRAFT_ENDPOINT; none: anywhere)",
    )
    g.add_argument(
        "--target-endpoint",
        default=None,
        metavar="RESOURCE",
        help="Ray node resource of the machines that run the target service (default $TARGET_ENDPOINT)",
    )
    g.add_argument(
        "--spec-max-batch",
        type=int,
        default=8,
        help="a target replica proposes only in steps with at most this many sequences, running or waiting (default 8)",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        help="an existing Ray cluster (e.g. auto, or HEAD:6379); default $RAY_ADDRESS, else a new local instance",
    )
    add_server_args(p)
    add_cache_args(p)
    p.set_defaults(run=run)


def deploy_config(args: argparse.Namespace):
    """The DeployConfig the options (and the environment) describe; ValueError for a bad one."""
    from speclm.deploy.config import DeployConfig
    from speclm.server.app import served_model_name

    refuse_gpu(args, "deploy")
    env = DeployConfig.env_defaults()
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    k = args.max_draft_tokens if args.max_draft_tokens is not None else env.get("max_draft_tokens", 4)
    config = DeployConfig(
        model=args.model,
        draft=args.draft,
        tokenizer=args.tokenizer,
        weights=args.weights,
        draft_weights=args.draft_weights,
        draft_replicas=args.draft_replicas,
        target_replicas=args.target_replicas,
        max_draft_tokens=k,
        adaptive=not args.no_adaptive,
        draft_timeout=args.draft_timeout,
        threads=args.threads,
        spec_max_batch=args.spec_max_batch,
        draft_endpoint=args.draft_endpoint or env.get("draft_endpoint"),
        target_endpoint=args.target_endpoint or env.get("target_endpoint"),
        cache=cache_config(args),
        server=server_config(args, args.served_model_name or ""),
    )
    config.server.model_name = args.served_model_name or served_model_name(config.model)
    return config


def run(args: argparse.Namespace) -> int:
    config = deploy_config(args)  # every mistake is found before Ray starts
    try:
        from speclm.deploy import launch
    except ImportError as e:
        print(f"speclm deploy: error: Ray Serve is not installed ({e}): pip install 'speclm[deploy]'", file=sys.stderr)
        return 2
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    launch.start(config, args.host, args.port, args.ray_address)
    draft = f"draft {os.path.basename(config.draft)} x{config.draft_replicas}, " if config.draft else ""
    print(
        f"speclm deploy: {draft}target {os.path.basename(config.model)} x{config.target_replicas}; "
        f"listening on http://{args.host}:{args.port} (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    try:
        stopping.wait()
    except KeyboardInterrupt:
        pass
    finally:
        launch.stop()
    return 0
