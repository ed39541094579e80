"""`speclm distill`: train a drafter for the target (a small draft model, Medusa heads or an EAGLE head)."""

from __future__ import annotations

import argparse
import json
import os

from speclm.cli.common import add_model_args, refuse_gpu
from speclm.data import SPECBENCH_PROMPTS

DEFAULT_PROMPTS = SPECBENCH_PROMPTS  # as `speclm bench`


def register(sub) -> None:
    p = sub.add_parser(
        "distill",
        help="train a drafter (draft model, Medusa or EAGLE heads) for speculative decoding",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Distil the target into a drafter for lossless speculative decoding. Data: the target's own "
        "greedy responses to the training prompts (Spec-Bench prompts after the first 10 of each category, which "
        "`speclm bench` reports on, plus ~40 built-in ones), with its post-norm hidden states, cached on disk under "
        "--data-dir keyed by model, weights, prompts and settings. Students: 'draft' = a small model of N target "
        "layers on the target's embeddings and tied head, saved as a Hugging Face directory (use it as "
        "draft:OUT); 'medusa' = K heads on the last hidden state; 'eagle' = one decoder layer over "
        "[hidden state; next-token embedding] (both saved as head files for medusa:OUT / eagle:OUT). Teacher "
        "distributions are the target's fp32 head applied to the cached features, over the full vocabulary or, "
        "with --token-map-size, over the most frequent response tokens.",
    )
    add_model_args(p)
    p.set_defaults(weights="int4")
    g = p.add_argument_group("student")
    g.add_argument("--student", required=True, choices=("draft", "medusa", "eagle"), help="what to train")
    g.add_argument("--out", required=True, help="output directory")
    g.add_argument("--layers", type=int, default=2, help="draft: decoder layers, copied from the target's")
    g.add_argument(
        "--layer-map",
        default="uniform",
        choices=("uniform", "last"),
        help="draft: which target layers initialise it (uniform: spread, last to last; last: the top N)",
    )
    g.add_argument(
        "--token-map-size",
        type=int,
        default=0,
        help="restrict the drafter's head to the N most frequent response tokens (0 = full vocabulary); "
        "the target still scores every token, so output stays exact",
    )
    g.add_argument("--medusa-heads", type=int, default=4, help="medusa: number of heads (head i predicts token t+2+i)")
    g.add_argument("--medusa-layers", type=int, default=1, help="medusa: residual blocks per head")
    g.add_argument(
        "--init-only",
        action="store_true",
        help="draft: save the undistilled initialisation (for the distillation-vs-init comparison)",
    )
    g = p.add_argument_group("loss")
    g.add_argument(
        "--loss",
        dest="divergence",
        default="fkl",
        choices=("fkl", "rkl", "jsd"),
        help="draft: forward KL, reverse KL (MiniLLM) or generalized JSD (GKD)",
    )
    g.add_argument("--alpha", type=float, default=0.0, help="weight of the hard-label CE (1 - alpha on the divergence)")
    g.add_argument("--temperature", type=float, default=1.0, help="softening temperature T (losses scale by T^2)")
    g.add_argument("--beta", type=float, default=0.5, help="JSD beta (0 = forward KL, 1 = reverse KL limits)")
    g.add_argument(
        "--on-policy",
        type=float,
        default=0.0,
        help="draft: fraction lambda of sequences replaced by the student's own samples, scored by the "
        "target (GKD); costs a target forward per such sequence",
    )
    g.add_argument(
        "--feature-weight",
        type=float,
        default=0.0,
        help="draft: weight of the hidden-state loss (student final hidden state, learned projection, vs the target's)",
    )
    g.add_argument(
        "--ce-weight", type=float, default=0.1, help="eagle: weight of the CE term beside the feature regression"
    )
    g.add_argument("--noise", type=float, default=0.1, help="eagle: uniform noise amplitude on input features")
    g.add_argument(
        "--unroll",
        type=int,
        default=1,
        choices=(1, 2),
        help="eagle: 2 adds a pass fed with its own predicted features (as drafting does)",
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--prompts",
        default=DEFAULT_PROMPTS,
        help="Spec-Bench JSONL; its first 10 prompts per category are held out for benchmarks",
    )
    g.add_argument("--no-own-prompts", action="store_true", help="leave out the built-in prompts")
    g.add_argument("--data-dir", default=".cache/distill", help="where target data is cached")
    g.add_argument("--max-new-tokens", type=int, default=128, help="target response length")
    g.add_argument("--max-prompt-tokens", type=int, default=512, help="skip longer prompts")
    g.add_argument("--no-chat", action="store_true", help="plain prompts instead of the chat template")
    g.add_argument("--gen-batch", type=int, default=16, help="sequences the batched engine decodes together")
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=int, default=200, help="optimizer steps")
    g.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    g.add_argument("--max-len", type=int, default=512, help="tokens per sequence at most (the end is kept)")
    g.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        help="eagle: hold out this fraction of the cached sequences (seeded) and keep the head with the "
        "best held-out first-draft agreement with the target (0 = train on all, keep the last step)",
    )
    g.add_argument("--eval-every", type=int, default=100, help="with --val-fraction: steps between validations")
    g.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (AdamW)")
    g.add_argument("--warmup-steps", type=int, default=10, help="linear warmup steps, then cosine decay")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final LR as a fraction of --lr")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    g.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip (0 = off)")
    g.add_argument("--seed", type=int, default=0, help="seed for init, batches, noise and samples")
    g.add_argument("--max-minutes", type=float, default=None, help="stop training after this long (then save)")
    g.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints in OUT/train_state")
    g.add_argument("--resume", action="store_true", help="continue from OUT/train_state/checkpoint.pt")
    p.set_defaults(run=run)


def options_from_args(args: argparse.Namespace):
    from speclm.distill.data import DataSettings
    from speclm.distill.run import DistillOptions
    from speclm.distill.trainer import TrainConfig

    train = TrainConfig(
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        min_lr_ratio=args.min_lr_ratio,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        seed=args.seed,
        max_minutes=args.max_minutes,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every if args.val_fraction else 0,
    )
    data = DataSettings(
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        chat=not args.no_chat,
        batch_size=args.gen_batch,
    )
    refuse_gpu(args, "distill")
    if args.prompts and not os.path.isfile(args.prompts):
        raise ValueError(f"--prompts {args.prompts}: no such file")
    return DistillOptions(
        args.student,
        args.out,
        model=args.model,
        tokenizer=args.tokenizer,
        weights=args.weights,
        prompts=args.prompts,
        own_prompts=not args.no_own_prompts,
        data_dir=args.data_dir,
        data=data,
        token_map_size=args.token_map_size,
        num_layers=args.layers,
        layer_style=args.layer_map,
        divergence=args.divergence,
        alpha=args.alpha,
        temperature=args.temperature,
        beta=args.beta,
        on_policy=args.on_policy,
        feature_weight=args.feature_weight,
        medusa_heads=args.medusa_heads,
        medusa_layers=args.medusa_layers,
        ce_weight=args.ce_weight,
        noise=args.noise,
        unroll=args.unroll,
        batch_size=args.batch_size,
        max_len=args.max_len,
        val_fraction=args.val_fraction,
        train=train,
        resume=args.resume,
        init_only=args.init_only,
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from speclm.distill.run import run_distill

    options = options_from_args(args)  # bad values fail before the slow load
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(run_distill(options)))
    return 0
