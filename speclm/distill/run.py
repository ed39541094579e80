"""One distillation run: load the target, get its cached data, build the student, train, save."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import torch

from speclm.distill.data import DataSettings, frequent_tokens, load_or_build, split_sequences
from speclm.distill.losses import DIVERGENCES
from speclm.distill.objectives import DraftObjective, EagleObjective, HeadSpace, MedusaObjective
from speclm.distill.prompts import training_prompts
from speclm.distill.student import init_draft_model, save_draft_model, trainable_draft_parameters
from speclm.distill.trainer import TrainConfig, Trainer
from speclm.models.builder import build_model
from speclm.models.loader import load_checkpoint
from speclm.speculative.heads import EagleHead, MedusaHeads, save_head

STUDENTS = ("draft", "medusa", "eagle")


@dataclass
class DistillOptions:
    """Everything `speclm distill` takes (see its --help for each field's meaning)."""

    student: str
    out: str
    model: str | None = None
    tokenizer: str | None = None
    weights: str = "int4"
    prompts: str | None = None
    own_prompts: bool = True
    data_dir: str = ".cache/distill"
    data: DataSettings = field(default_factory=DataSettings)
    token_map_size: int = 0
    num_layers: int = 2
    layer_style: str = "uniform"
    divergence: str = "fkl"
    alpha: float = 0.0
    temperature: float = 1.0
    beta: float = 0.5
    on_policy: float = 0.0
    feature_weight: float = 0.0
    medusa_heads: int = 4
    medusa_layers: int = 1
    ce_weight: float = 0.1
    noise: float = 0.1
    unroll: int = 1
    batch_size: int = 4
    max_len: int = 512
    val_fraction: float = 0.0
    train: TrainConfig = field(default_factory=TrainConfig)
    resume: bool = False
    init_only: bool = False

    def __post_init__(self) -> None:
        if self.student not in STUDENTS:
            raise ValueError(f"--student must be one of {', '.join(STUDENTS)}, got {self.student!r}")
        if self.token_map_size < 0 or self.batch_size < 1 or self.max_len < 4:
            raise ValueError(
                f"need --token-map-size >= 0, --batch-size >= 1, --max-len >= 4; got "
                f"{self.token_map_size}, {self.batch_size}, {self.max_len}"
            )
        if self.init_only and self.student != "draft":
            raise ValueError("--init-only saves an untrained draft model; it needs --student draft")
        for name in ("alpha", "beta", "on_policy"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(f"--temperature must be positive, got {self.temperature}")
        if min(self.feature_weight, self.ce_weight, self.noise) < 0:
            raise ValueError(
                f"--feature-weight, --ce-weight and --noise must be >= 0, got "
                f"{self.feature_weight}, {self.ce_weight}, {self.noise}"
            )
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"--loss must be one of {', '.join(DIVERGENCES)}, got {self.divergence!r}")
        if self.num_layers < 1 or self.medusa_heads < 1 or self.medusa_layers < 1:
            raise ValueError(
                f"--layers, --medusa-heads and --medusa-layers must be >= 1, got "
                f"{self.num_layers}, {self.medusa_heads}, {self.medusa_layers}"
            )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if self.val_fraction and self.student != "eagle":
            raise ValueError(
                f"--val-fraction scores EAGLE's first drafts; it needs --student eagle, got {self.student!r}"
            )
        if self.prompts is None and not self.own_prompts:
            raise ValueError("no training prompts: give --prompts or keep the built-in ones")


@dataclass
class Prepared:
    """A built objective and what saving it needs."""

    objective: object
    llm: object
    data_path: str
    num_sequences: int
    num_tokens: int
    num_validation: int
    token_map: torch.Tensor | None
    teacher_layers: list[int] | None
    data_seconds: float


def prepare(opts: DistillOptions, llm=None) -> Prepared:
    """Load the target (unless `llm`, a speclm.LLM, is given), get its cached data and build the
    student and its objective."""
    from speclm.llm import LLM

    torch.manual_seed(opts.train.seed)
    start = time.perf_counter()
    llm = llm or LLM(opts.model, tokenizer=opts.tokenizer, weights=opts.weights, device="cpu")
    prompts = training_prompts(opts.prompts, own=opts.own_prompts)
    data, data_path = load_or_build(llm, opts.weights, prompts, opts.data, opts.data_dir)
    validation = None
    if opts.val_fraction:
        train_ids, val_ids = split_sequences(len(data), opts.val_fraction, opts.train.seed)
        data, validation = data.subset(train_ids), data.subset(val_ids)
    data_seconds = time.perf_counter() - start
    checkpoint = load_checkpoint(llm.model_path)
    c = checkpoint.config
    head_weight = checkpoint.tensors["model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"]
    token_map = (
        frequent_tokens(data.token_counts, opts.token_map_size, always=c.eos_token_ids + llm.tokenizer.added_token_ids)
        if opts.token_map_size
        else None
    )
    space = HeadSpace(head_weight, token_map)
    layers = None
    if opts.student == "draft":
        student, layers = init_draft_model(checkpoint, opts.num_layers, opts.layer_style)
        trainable_draft_parameters(student)
        objective = DraftObjective(
            student,
            data,
            space,
            opts.divergence,
            opts.alpha,
            opts.temperature,
            opts.beta,
            opts.on_policy,
            llm.model if opts.on_policy else None,
            opts.feature_weight,
            opts.batch_size,
            opts.max_len,
        )
    elif opts.student == "medusa":
        heads = MedusaHeads(c.hidden_size, c.vocab_size, opts.medusa_heads, opts.medusa_layers, token_map)
        objective = MedusaObjective(heads, data, space, opts.alpha, batch_size=opts.batch_size, max_len=opts.max_len)
    else:
        objective = EagleObjective(
            init_eagle_head(checkpoint, token_map),
            checkpoint.tensors["model.embed_tokens.weight"],
            data,
            space,
            opts.ce_weight,
            opts.noise,
            opts.unroll,
            opts.batch_size,
            opts.max_len,
            validation,
        )
    num_validation = len(validation) if validation is not None else 0
    return Prepared(
        objective, llm, data_path, len(data), int(data.tokens.numel()), num_validation, token_map, layers, data_seconds
    )


def save_student(opts: DistillOptions, prepared: Prepared, metadata: dict) -> None:
    """The draft as a Hugging Face directory (+ token map), or the head via save_head."""
    metadata = {"trained_on": prepared.data_path, "options": _jsonable(asdict(opts))} | metadata
    if opts.student == "draft":
        student = prepared.objective.student
        save_draft_model(
            student,
            prepared.llm.tokenizer,
            opts.out,
            prepared.token_map,
            metadata | {"teacher_layers": prepared.teacher_layers},
        )
    else:
        save_head(prepared.objective.module, opts.out, metadata)


def run_distill(opts: DistillOptions, llm=None) -> dict:
    """Train (or, with init_only, just initialise) the student and save it in opts.out. Returns a
    summary: data size, seconds per stage, first and final losses (means of 10 steps) and, with a
    validation split, the held-out score at each evaluation and the best step (the one saved)."""
    start = time.perf_counter()
    prepared = prepare(opts, llm)
    summary = {
        "out": opts.out,
        "sequences": prepared.num_sequences,
        "tokens": prepared.num_tokens,
        "data_s": round(prepared.data_seconds, 1),
        "steps": 0,
    }
    if prepared.num_validation:
        summary["val_sequences"] = prepared.num_validation
    if not opts.init_only:
        result = Trainer(prepared.objective, opts.train, os.path.join(opts.out, "train_state")).train(opts.resume)
        summary |= {
            "steps": result.steps_done,
            "train_s": round(result.seconds, 1),
            "first_loss": _mean(result.losses[:10]),
            "final_loss": _mean(result.losses[-10:]),
            "stopped_by_time": result.stopped_by_time,
        }
        if result.evals:  # the module now holds the best step's state: that is what gets saved
            summary |= {
                "val_agree": [[step, round(score, 4)] for step, score in result.evals],
                "best_step": result.best_step,
                "best_val_agree": round(max(s for _, s in result.evals), 4),
            }
    save_student(opts, prepared, {k: v for k, v in summary.items() if k != "out"})
    summary["total_s"] = round(time.perf_counter() - start, 1)
    return summary


def init_eagle_head(checkpoint, token_map: torch.Tensor | None) -> EagleHead:
    """An EagleHead whose decoder layer starts as the target's last layer with its two output
    projections (o_proj, down_proj) zeroed and fc = [I, 0]: the untrained head returns f_t itself,
    and attention/MLP start from the target's learned q/k/v and gate/up. Measured on SmolLM2 (80
    steps, lr 1e-3): top-1 agreement with the target 0.32, vs 0.09 keeping the whole last layer with
    fc = [I, I] (whose outputs are on the residual-stream scale, far from post-norm features)."""
    target = build_model(checkpoint)
    head = EagleHead(checkpoint.config, token_map)
    head.layer.load_state_dict({k: v.detach().clone() for k, v in target.layers[-1].state_dict().items()})
    h = checkpoint.config.hidden_size
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1))
        head.fc.bias.zero_()
        head.layer.self_attn.o_proj.weight.zero_()
        head.layer.mlp.down_proj.weight.zero_()
    for p in head.parameters():
        p.requires_grad_(True)
    return head


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 5) if values else None


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool, type(None), list)) else str(value)
