"""The Python API: LLM(model=...).generate(prompts, SamplingParams(...)), on the same engine as the server."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import torch

from speclm.config import CacheConfig, SpecConfig, WeightFormat
from speclm.engine.engine import Engine
from speclm.engine.model_runner import ModelRunner
from speclm.engine.request import Request, RequestOutput, StreamChunk
from speclm.models.builder import build_model
from speclm.models.checkpoint import ModelLoadError
from speclm.models.device import resolve_device
from speclm.models.llama import LlamaModel
from speclm.models.loader import load_checkpoint
from speclm.sampling_params import SamplingParams
from speclm.speculative.factory import ProposerFactory
from speclm.structured.grammar import constraint_from_response_format
from speclm.threads import default_threads
from speclm.tokenizer import Tokenizer, load_tokenizer

Prompt = str | list[int]


class LLM:
    """A loaded model ready to generate, optionally with speculative decoding.

    model: None (the default SmolLM2-135M-Instruct), a .gguf file, a Hugging Face model directory,
    a llama2.c .bin (with tokenizer=...), or a hub id (needs a network).
    spec: None, or 'ngram', 'layerskip:N', 'draft:PATH', 'medusa:PATH', 'eagle:PATH' (see
    speclm.config.SPEC_METHODS_HELP for options); num_speculative_tokens is K (the maximum when adaptive; the node
    budget of medusa/eagle trees; None: the method's default, SpecConfig.max_k). weights: the runtime format of
    the linear layers: auto (the default: a GGUF file's own quantization types, fp32 for other files) | fp32 |
    bf16 | int8 | int4[:GROUP] (see speclm.models.weight_formats). cache: the paged KV cache the engine runs on;
    spec_max_batch: the engine drafts only in steps with at most this many sequences (running or waiting to be
    admitted; None: the method's default, SpecConfig.default_max_batch).
    device: auto (the default: a CUDA GPU when torch sees one, else the CPU) | cpu | cuda | cuda:N; on a
    GPU the weights are dense bf16 (auto, bf16; fp16 where bf16 is missing) or fp32. cuda_graphs: on a
    GPU, decode and verification steps replay CUDA graphs (False: every step eager); batch_invariant: on a
    GPU, the linear layers run over fixed row chunks so speculative greedy equals plain greedy in bf16
    too (False: one GEMM per layer, faster prompts and big batches). Both are ignored on the CPU.
    Prompts are checked here (the engine trusts its requests): a bad one raises ValueError.

    generate() runs all its prompts together in one batch; each result equals that prompt run alone.
    """

    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        spec: str | SpecConfig | None = None,
        num_speculative_tokens: int | None = None,
        adaptive: bool = True,
        threads: int | None = None,
        weights: str | None = "auto",
        cache: CacheConfig | None = None,
        spec_max_batch: int | None = None,
        device: str | None = "auto",
        cuda_graphs: bool = True,
        batch_invariant: bool = True,
    ) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        torch.set_num_threads(threads or default_threads())  # default: the cores idle now (speclm/threads.py)
        self.weights = WeightFormat.parse(weights or "auto")  # a bad value fails before the slow load
        self.device = resolve_device(device)  # likewise: `cuda` without a GPU is a ValueError now
        spec = SpecConfig.parse(spec, num_speculative_tokens, adaptive) if isinstance(spec, str) else spec
        checkpoint = load_checkpoint(model)
        self.model_path = checkpoint.source
        if self.device.type == "cpu":
            self.model: LlamaModel = build_model(checkpoint, weights=self.weights)
        else:  # dense bf16 (or fp16; fp32 with weights="fp32") weights on the GPU (speclm/models/builder.py)
            self.model = build_model(checkpoint, weights=self.weights, device=self.device)
        del checkpoint  # drop the file's reader (its parsed metadata) before loading the tokenizer
        self.tokenizer: Tokenizer = load_tokenizer(self.model_path, tokenizer)
        if self.tokenizer.vocab_size > self.model.config.vocab_size:
            raise ModelLoadError(
                f"tokenizer has {self.tokenizer.vocab_size} tokens but the model only {self.model.config.vocab_size}"
            )
        self.runner = ModelRunner(self.model, "auto" if cuda_graphs else "off", batch_invariant)
        self.proposers = ProposerFactory(self.model, self.weights)
        self.cache_config, self.spec_max_batch = cache or CacheConfig(), spec_max_batch
        self._ids = itertools.count()
        self._set_spec(spec)

    def _set_spec(self, spec: SpecConfig | None) -> None:
        if spec is not None:
            self.proposers(spec)  # builds (and so checks) the proposer now, not at the first request
        self.spec = spec
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        """The engine over this LLM's cache settings and method, built at first use: an LLM served only by
        an engine of its own (LLM.with_engine, server.app.build_app with a cache) allocates no KV pool."""
        if self._engine is None:
            self._engine = Engine(
                self.runner, self.tokenizer, self.cache_config, self.spec, self.proposers, self.spec_max_batch
            )
        return self._engine

    def with_spec(
        self, spec: str | SpecConfig | None, num_speculative_tokens: int | None = None, adaptive: bool = True
    ) -> LLM:
        """A new LLM sharing this one's weights, tokenizer and loaded proposers, with another speculative method."""
        other = self._sibling()
        other._set_spec(SpecConfig.parse(spec, num_speculative_tokens, adaptive) if isinstance(spec, str) else spec)
        return other

    def with_engine(self, cache: CacheConfig | None = None, spec_max_batch: int | None = None) -> LLM:
        """A new LLM sharing this one's weights, tokenizer, speculative method and loaded proposers, with an
        engine of its own over `cache` (default: this one's cache settings)."""
        other = self._sibling()
        other.cache_config = cache or self.cache_config
        other.spec_max_batch = self.spec_max_batch if spec_max_batch is None else spec_max_batch
        other._set_spec(self.spec)
        return other

    def _sibling(self) -> LLM:
        """A copy without an engine (the caller builds one), with proposer state of its own."""
        other = object.__new__(LLM)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("_engine", "_ids")})
        other._ids = itertools.count()
        other.proposers = self.proposers.for_another_engine()
        return other

    # -- prompts -------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def _request(self, prompt_ids: list[int], params: SamplingParams | None) -> Request:
        """The engine's request for a prompt, checked against the engine's limits (ValueError: empty,
        ids outside the vocabulary, or no room for one generated token)."""
        self.engine.limits.check_prompt(prompt_ids)
        return Request(str(next(self._ids)), prompt_ids, params or SamplingParams())

    # -- generation ----------------------------------------------------------------------
    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | None = None) -> list[RequestOutput]:
        """Complete each prompt (text or token ids); one RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        requests = [self._request(self.encode(p), params) for p in prompts]
        texts = [p if isinstance(p, str) else None for p in prompts]
        return [outputs[0] for outputs in self.engine.generate(requests, prompts=texts)]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[StreamChunk]:
        """Yield text chunks as they are generated; the last chunk's `output` holds the result."""
        return self._stream(self._request(self.encode(prompt), params), prompt if isinstance(prompt, str) else None)

    def chat(
        self,
        messages: list[dict],
        params: SamplingParams | None = None,
        response_format: dict | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> RequestOutput:
        """Answer a conversation ([{'role': 'user', 'content': ...}, ...]) with the chat template;
        `response_format` as OpenAI's ({"type": "json_object"} or {"type": "json_schema", "json_schema":
        {"name": ..., "schema": {...}}}) constrains the answer (ConstraintError when invalid);
        `chat_template_kwargs` are the template's own variables ({"enable_thinking": False} for Qwen3)."""
        if response_format is not None:
            params = dataclasses.replace(
                params or SamplingParams(), constraint=constraint_from_response_format(response_format)
            )
        request = self._request(self.tokenizer.encode_chat(messages, chat_template_kwargs), params)
        return self.engine.generate([request])[0][0]

    def stream_chat(
        self, messages: list[dict], params: SamplingParams | None = None, chat_template_kwargs: dict | None = None
    ) -> Iterator[StreamChunk]:
        return self._stream(self._request(self.tokenizer.encode_chat(messages, chat_template_kwargs), params), None)

    def _stream(self, request: Request, prompt: str | None) -> Iterator[StreamChunk]:
        self.engine.add_request(request, 1, prompt)
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.error is not None:
                        raise out.error
                    if out.token_ids or out.text or out.output is not None:
                        yield StreamChunk(out.text, out.token_ids, out.output)
        finally:  # a consumer that stops early leaves nothing running
            self.engine.abort(request.request_id)
