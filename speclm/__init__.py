"""speclm: a PyTorch LLM inference engine with lossless speculative decoding."""

from speclm.llm import LLM
from speclm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"
