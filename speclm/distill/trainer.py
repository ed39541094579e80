"""A small training loop: AdamW, warmup + cosine LR, grad clipping, time budget, resumable checkpoints,
held-out validation keeping the best state."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import nn
from tqdm import tqdm

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass
class TrainConfig:
    """Optimizer and loop settings. The LR warms up linearly for `warmup_steps`, then follows a
    cosine from `lr` down to `min_lr_ratio * lr` at `steps`. `max_minutes` stops early (the model is
    saved either way); a checkpoint is written every `checkpoint_every` steps (0 = only at the end).
    `eval_every` > 0 scores the objective's validate() every that many steps and at the end, and the
    module ends with the best-scoring state (early stopping by selection)."""

    steps: int = 200
    lr: float = 1e-4
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    max_minutes: float | None = None
    checkpoint_every: int = 50
    eval_every: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"--steps must be positive, got {self.steps}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be positive, got {self.lr}")
        if min(self.warmup_steps, self.checkpoint_every, self.eval_every) < 0:
            raise ValueError(
                f"--warmup-steps, --checkpoint-every and --eval-every must be >= 0, got "
                f"{self.warmup_steps}, {self.checkpoint_every}, {self.eval_every}"
            )
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError(f"--grad-clip and --weight-decay must be >= 0, got {self.grad_clip}, {self.weight_decay}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"--max-minutes must be positive, got {self.max_minutes}")


def lr_factor(step: int, config: TrainConfig) -> float:
    """The LR multiplier at `step` (0-based): linear warmup, then cosine decay to min_lr_ratio."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class Objective(Protocol):
    """What the loop trains: `module` holds the trainable parameters (those with requires_grad);
    `loss(generator)` draws its own batch with the step's generator and returns (loss, stats).
    An objective may also have `validate() -> float | None`: a held-out score, higher is better."""

    module: nn.Module

    def loss(self, generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]: ...


@dataclass
class TrainResult:
    steps_done: int
    losses: list[float]
    seconds: float
    stopped_by_time: bool
    evals: list[tuple[int, float]]  # (step, validation score) at each evaluation
    best_step: int | None  # the step whose state the module ends with (None: no validation)


def step_generator(seed: int, step: int) -> torch.Generator:
    """The step's own generator: batches, noise and student samples depend only on (seed, step), so a
    resumed run draws exactly what an uninterrupted one would have."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class Trainer:
    """Runs an Objective for config.steps steps, checkpointing into `checkpoint_dir`."""

    def __init__(self, objective: Objective, config: TrainConfig, checkpoint_dir: str) -> None:
        self.objective, self.config, self.checkpoint_dir = objective, config, checkpoint_dir
        self.params = [p for p in objective.module.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the objective has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, config))
        self.step, self.losses = 0, []
        self.evals: list[tuple[int, float]] = []
        self.best: tuple[int, float, dict[str, torch.Tensor]] | None = None  # (step, score, trainable state)

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.checkpoint_dir, CHECKPOINT_FILE)

    def save_checkpoint(self) -> None:
        """Model (trainable module), optimizer, LR schedule, step, losses and RNG state, atomically."""
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        state = {
            "module": self._trainable_state(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "losses": self.losses,
            "rng": torch.get_rng_state(),
            "config": asdict(self.config),
            "evals": self.evals,
            "best": self.best,
        }
        torch.save(state, self.checkpoint_path + ".tmp")
        os.replace(self.checkpoint_path + ".tmp", self.checkpoint_path)

    def _trainable_state(self) -> dict[str, torch.Tensor]:
        """The module's trainable tensors only: frozen ones (a draft's embedding table, ~80% of its
        bytes) are rebuilt from the target on resume."""
        trainable = {n for n, p in self.objective.module.named_parameters() if p.requires_grad}
        return {k: v for k, v in self.objective.module.state_dict().items() if k in trainable}

    def load_checkpoint(self) -> None:
        if not os.path.isfile(self.checkpoint_path):
            raise ValueError(f"--resume: no checkpoint at {self.checkpoint_path}")
        state = torch.load(self.checkpoint_path, weights_only=False)
        if state["config"]["seed"] != self.config.seed or state["config"]["steps"] != self.config.steps:
            raise ValueError(
                f"--resume: {self.checkpoint_path} was made with seed {state['config']['seed']} and "
                f"{state['config']['steps']} steps; this run has {self.config.seed} and {self.config.steps}"
            )
        _, unexpected = self.objective.module.load_state_dict(state["module"], strict=False)
        if unexpected or set(self._trainable_state()) - set(state["module"]):
            raise ValueError(
                f"--resume: {self.checkpoint_path} does not fit this student (unexpected {unexpected[:3]})"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step, self.losses = state["step"], state["losses"]
        self.evals, self.best = state.get("evals", []), state.get("best")
        torch.set_rng_state(state["rng"])

    def train(self, resume: bool = False, stop_at: int | None = None) -> TrainResult:
        """Train up to config.steps (or `stop_at`, for tests of interruption) or the time budget."""
        if resume:
            self.load_checkpoint()
        else:
            torch.manual_seed(self.config.seed)
        cfg, start = self.config, time.perf_counter()
        end = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
        budget = cfg.max_minutes * 60 if cfg.max_minutes else math.inf
        stopped_by_time = False
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train", unit="step")
        self.objective.module.train()
        while self.step < end:
            if time.perf_counter() - start > budget:
                stopped_by_time = True
                break
            with torch.enable_grad():
                loss, stats = self.objective.loss(step_generator(cfg.seed, self.step))
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            if cfg.grad_clip > 0:
                nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            self.losses.append(float(loss.detach()))
            bar.update(1)
            bar.set_postfix(loss=f"{self.losses[-1]:.4f}", **{k: f"{v:.3f}" for k, v in stats.items()})
            if cfg.eval_every and self.step % cfg.eval_every == 0:
                self._evaluate()
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self.save_checkpoint()
        bar.close()
        if cfg.eval_every and (not self.evals or self.evals[-1][0] != self.step):
            self._evaluate()
        self.objective.module.eval()
        self.save_checkpoint()
        if self.best is not None:  # after the checkpoint, so a resumed run continues from the last step
            self.objective.module.load_state_dict(self.best[2], strict=False)
        return TrainResult(
            self.step,
            self.losses,
            time.perf_counter() - start,
            stopped_by_time,
            self.evals,
            self.best[0] if self.best else None,
        )

    def _evaluate(self) -> None:
        """Score the objective's validate() now; remember the trainable state if it is the best so far."""
        validate = getattr(self.objective, "validate", None)
        self.objective.module.eval()
        score = validate() if validate is not None else None
        self.objective.module.train()
        if score is None:
            return
        self.evals.append((self.step, score))
        tqdm.write(f"step {self.step}: validation {score:.4f}")
        if self.best is None or score > self.best[1]:
            self.best = (self.step, score, {k: v.detach().clone() for k, v in self._trainable_state().items()})
