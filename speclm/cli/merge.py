"""`speclm merge`: merge checkpoints (linear, task arithmetic, TIES, DARE, SLERP) from a mergekit-style YAML."""

from __future__ import annotations

import argparse

EXAMPLE = """example merge.yaml:
  merge_method: ties            # linear | task_arithmetic | ties | dare_linear | dare_ties | slerp
  base_model: path/to/base
  models:
    - model: path/to/finetune_a
      parameters: {weight: 1.0}
    - model: path/to/finetune_b
      parameters: {weight: 0.5}
  parameters: {density: 0.5, lambda: 1.0}   # slerp: {t: 0.5}; linear: {normalize: true}
  seed: 0                       # DARE's random drops
"""


def register(sub) -> None:
    p = sub.add_parser(
        "merge",
        help="merge models (mergekit-style YAML)",
        description=__doc__.splitlines()[0],
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="merge YAML")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=None, help="overrides the YAML's seed (DARE)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from speclm.compress.merge_config import MergeConfig, run_merge
    from speclm.compress.save import save_checkpoint
    from speclm.tokenizer import load_tokenizer

    with open(args.config) as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ValueError(f"{args.config}: invalid YAML: {e}") from e
    config = MergeConfig.from_dict(raw)
    if args.seed is not None:
        config.seed = args.seed
    reference, tensors = run_merge(config)
    source = config.tokenizer_source if config.tokenizer_source not in (None, "base") else reference.source
    tokenizer = load_tokenizer(source, config.tokenizer)
    metadata = {"merge": raw}
    save_checkpoint(args.out, reference.config, tensors, tokenizer, metadata)
    print(f"wrote {config.merge_method} merge of {len(config.models)} models to {args.out}")
    return 0
