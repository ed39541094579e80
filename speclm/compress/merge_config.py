"""mergekit-style YAML merge configurations: parse, check compatibility, merge every tensor."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from speclm.compress import merge
from speclm.models.checkpoint import Checkpoint
from speclm.models.loader import load_checkpoint

MERGE_METHODS = ("linear", "task_arithmetic", "ties", "dare_linear", "dare_ties", "slerp")
NEEDS_BASE = ("task_arithmetic", "ties", "dare_linear", "dare_ties", "slerp")


@dataclass
class MergeModel:
    """One input model and its per-model parameters (weight, density)."""

    model: str
    weight: float = 1.0
    density: float = 1.0


@dataclass
class MergeConfig:
    """merge_method, models, base_model, global parameters (t, lambda, normalize), seed, tokenizer_source."""

    merge_method: str
    models: list[MergeModel]
    base_model: str | None = None
    t: float = 0.5
    scale: float = 1.0
    normalize: bool = True
    seed: int = 0
    tokenizer_source: str | None = None
    tokenizer: str | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> MergeConfig:
        """Read the mergekit layout: merge_method, base_model, models: [{model, parameters}], parameters."""
        if not isinstance(d, dict):
            raise ValueError("merge config must be a YAML mapping")
        method = d.get("merge_method")
        if method not in MERGE_METHODS:
            raise ValueError(f"merge_method {method!r} is not supported; choose from {', '.join(MERGE_METHODS)}")
        unknown = set(d) - {
            "merge_method",
            "models",
            "base_model",
            "parameters",
            "dtype",
            "seed",
            "tokenizer_source",
            "tokenizer",
        }
        if unknown:
            raise ValueError(f"unknown merge config keys: {', '.join(sorted(unknown))}")
        if d.get("dtype", "float32") not in ("float32", "fp32"):
            raise ValueError(f"dtype {d['dtype']!r}: speclm merges and saves float32")
        params = d.get("parameters") or {}
        defaults = {"weight": params.get("weight", 1.0), "density": params.get("density", 1.0)}
        models = []
        for entry in d.get("models") or []:
            if isinstance(entry, str):
                entry = {"model": entry}
            if not isinstance(entry, dict) or "model" not in entry:
                raise ValueError(f"each models entry needs a 'model' path, got {entry!r}")
            p = {**defaults, **(entry.get("parameters") or {})}
            models.append(MergeModel(str(entry["model"]), float(p["weight"]), float(p["density"])))
        config = cls(
            method,
            models,
            d.get("base_model"),
            float(params.get("t", 0.5)),
            float(params.get("lambda", params.get("scale", 1.0))),
            bool(params.get("normalize", True)),
            int(d.get("seed", 0)),
            d.get("tokenizer_source"),
            d.get("tokenizer"),
        )
        config.validate()
        return config

    def validate(self) -> None:
        if not self.models:
            raise ValueError("merge config lists no models")
        if self.merge_method in NEEDS_BASE and not self.base_model:
            raise ValueError(f"{self.merge_method} needs base_model")
        if self.merge_method == "slerp":
            others = [m for m in self.models if m.model != self.base_model]
            if len(others) != 1 and not (len(self.models) == 2 and self.models[0].model == self.models[1].model):
                raise ValueError("slerp interpolates exactly two models: base_model and one other")
            if not 0 <= self.t <= 1:
                raise ValueError(f"slerp t must be in [0, 1], got {self.t}")
        for m in self.models:
            if not 0 < m.density <= 1:
                raise ValueError(f"density of {m.model} must be in (0, 1], got {m.density}")
        if self.merge_method == "linear" and self.normalize and sum(m.weight for m in self.models) == 0:
            raise ValueError("linear merge weights sum to 0; cannot normalize")


def check_compatible(reference: Checkpoint, other: Checkpoint) -> None:
    """Same architecture, sizes, vocabulary and tensor shapes, or a ValueError naming the difference."""
    a, b = reference.config, other.config
    for key in (
        "architecture",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "tie_word_embeddings",
    ):
        if getattr(a, key) != getattr(b, key):
            raise ValueError(
                f"cannot merge {other.source} into {reference.source}: {key} differs "
                f"({getattr(b, key)} vs {getattr(a, key)})"
            )
    if set(reference.tensors) != set(other.tensors):
        missing = sorted(set(reference.tensors) ^ set(other.tensors))[:3]
        raise ValueError(f"cannot merge {other.source} into {reference.source}: different tensors, e.g. {missing}")
    for name, t in reference.tensors.items():
        if other.tensors[name].shape != t.shape:
            raise ValueError(
                f"cannot merge {other.source}: {name} has shape {tuple(other.tensors[name].shape)}, "
                f"expected {tuple(t.shape)}"
            )


def run_merge(config: MergeConfig) -> tuple[Checkpoint, dict[str, torch.Tensor]]:
    """Load the models, check them, merge tensor by tensor; returns (reference checkpoint, merged tensors)."""
    cache: dict[str, Checkpoint] = {}

    def load(path: str) -> Checkpoint:
        if path not in cache:
            cache[path] = load_checkpoint(path)
        return cache[path]

    base = load(config.base_model) if config.base_model else None
    models = [load(m.model) for m in config.models]
    reference = base or models[0]
    for ck in models:
        check_compatible(reference, ck)
    generator = torch.Generator().manual_seed(config.seed)
    weights = [m.weight for m in config.models]
    density = config.models[0].density
    if any(m.density != density for m in config.models):
        raise ValueError("per-model densities must be equal in speclm's TIES/DARE (set parameters.density once)")
    merged = {}
    for name in tqdm(sorted(reference.tensors), desc=f"merge ({config.merge_method})", unit="tensor"):
        ts = [ck.tensors[name].float() for ck in models]
        method = config.merge_method
        if method == "linear":
            merged[name] = merge.linear(ts, weights, config.normalize)
        elif method == "task_arithmetic":
            merged[name] = merge.task_arithmetic(base.tensors[name], ts, weights, config.scale)
        elif method == "ties":
            merged[name] = merge.ties(base.tensors[name], ts, weights, density, config.scale)
        elif method in ("dare_linear", "dare_ties"):
            merged[name] = merge.dare(
                base.tensors[name], ts, weights, density, generator, method == "dare_ties", config.scale
            )
        else:
            other = next((ck for m, ck in zip(config.models, models) if m.model != config.base_model), models[-1])
            merged[name] = merge.slerp(base.tensors[name], other.tensors[name], config.t)
    return reference, merged
