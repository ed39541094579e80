"""Requests, the scheduler, the model runner and the one engine that the Python API and the server drive."""

from speclm.engine.engine import Engine
from speclm.engine.model_runner import ModelRunner
from speclm.engine.request import GenerationStats, Request, RequestOutput, SequenceOutput, StreamChunk

__all__ = ["Engine", "GenerationStats", "ModelRunner", "Request", "RequestOutput", "SequenceOutput", "StreamChunk"]
