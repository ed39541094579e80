"""Fixtures for speculative decoding tests: a draft model that disagrees with stories260K."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from speclm.models import load_checkpoint
from tests.conftest import STORIES_MODEL


def write_hf_dir(checkpoint, path: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(checkpoint.config.to_hf_dict(), f)
    save_file({k: v.contiguous() for k, v in checkpoint.tensors.items()}, os.path.join(path, "model.safetensors"))
    return path


def write_perturbed_stories(path: str) -> str:
    """stories260K with Gaussian noise on every weight, as an HF directory at `path`: a draft model that
    often disagrees."""
    checkpoint = load_checkpoint(STORIES_MODEL)
    g = torch.Generator().manual_seed(0)
    for name, t in checkpoint.tensors.items():
        if t.dim() == 2:
            checkpoint.tensors[name] = t + 0.5 * t.std() * torch.randn(t.shape, generator=g)
    return write_hf_dir(checkpoint, path)


@pytest.fixture(scope="session")
def perturbed_stories_dir(tmp_path_factory) -> str:
    return write_perturbed_stories(str(tmp_path_factory.mktemp("perturbed_stories")))
