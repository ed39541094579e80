"""Requests, the model runner and the decode loop."""
from speclm.engine.llm_engine import LLMEngine, StreamChunk
from speclm.engine.model_runner import ModelRunner
from speclm.engine.request import GenerationStats, Request, RequestOutput

__all__ = ["GenerationStats", "LLMEngine", "ModelRunner", "Request", "RequestOutput", "StreamChunk"]
