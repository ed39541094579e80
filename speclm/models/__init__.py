"""Model architectures and loading."""

from speclm.models.builder import build_model
from speclm.models.checkpoint import Checkpoint, ModelLoadError
from speclm.models.config import ModelConfig
from speclm.models.llama import LlamaModel
from speclm.models.loader import load_checkpoint

__all__ = ["Checkpoint", "LlamaModel", "ModelConfig", "ModelLoadError", "build_model", "load_checkpoint"]
