"""OpenAI-style request and response schemas (pydantic) and their translation to SamplingParams.

Fields are strict: a string is not a boolean, 1.0 is not an integer, NaN is not a number. Numeric
ranges are those SamplingParams enforces; requests outside them never reach the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, StrictBool, StrictStr, field_validator

from speclm.sampling_params import SEED_RANGE, SamplingParams
from speclm.server.tool_protocol import ToolChatFields
from speclm.structured.grammar import Constraint, ConstraintError, compile_constraint, constraint_from_response_format
from speclm.tokenizer import check_template_kwargs

Number = Annotated[float, Strict()]  # an int or a float, not a string or a boolean


def _integral_float(value: object) -> object:
    """1.0 is an integer in JSON Schema (OpenAI's and vLLM's servers accept it): take it as 1."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer as JSON Schema has it: 1 or 1.0, not 1.5, "1" or true.
JsonInt = Annotated[int, BeforeValidator(_integral_float), Strict()]
TokenId = Annotated[int, Strict(), Field(ge=0)]
NonEmptyStr = Annotated[str, Strict(), Field(min_length=1)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its `guided_*` fields before v0.11): exactly one of these."""

    model_config = ConfigDict(extra="forbid")

    json_: dict | bool | None = Field(default=None, alias="json")
    regex: StrictStr | None = None
    choice: list | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None

    def constraints(self) -> list[tuple[str, Constraint]]:
        out = []
        for kind, name, value in (
            ("json_schema", "json", self.json_),
            ("regex", "regex", self.regex),
            ("choice", "choice", self.choice),
            ("grammar", "grammar", self.grammar),
            ("json_object", "json_object", self.json_object or None),
        ):
            if value is not None:
                param = f"structured_outputs.{name}"
                out.append((param, compile_constraint(kind, value, param)))
        return out


# Fields outside a request's schema are kept (model_extra) for routes to serve or refuse
# (server/request_fields.py); the document promises none, so a fuzzer's valid cases carry none.
REQUEST_CONFIG = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})


class GenerationRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = REQUEST_CONFIG

    model: StrictStr | None = None
    max_tokens: JsonInt | None = Field(
        default=None, ge=-1, description="-1: up to the context (llama-server's convention; OpenAI's minimum is 1)"
    )
    n_predict: JsonInt | None = Field(
        default=None, ge=-1, description="llama-server's max_tokens (-1: no limit); max_tokens wins when both are given"
    )
    temperature: Number | None = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number | None = Field(default=1.0, gt=0.0, le=1.0)
    top_k: JsonInt = Field(default=0, ge=0, description="not in OpenAI's API (vLLM accepts it too); 0 = off")
    min_p: Number = Field(
        default=0.0, ge=0.0, le=1.0, description="not in OpenAI's API (vLLM and llama-server take it); 0 = off"
    )
    presence_penalty: Number | None = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: Number | None = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: Number | None = Field(
        default=1.0, gt=0.0, description="not in OpenAI's API (vLLM's: over prompt and output); 1 = off"
    )
    n: JsonInt = Field(default=1, ge=1)
    stop: NonEmptyStr | list[NonEmptyStr] | None = None
    seed: JsonInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    response_format: dict | None = Field(
        default=None, description='{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}'
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None, description="vLLM's extension: one of json, regex, choice, grammar, json_object"
    )
    guided_json: dict | bool | None = Field(default=None, description="vLLM's older name of structured_outputs.json")
    guided_regex: StrictStr | None = Field(default=None, description="vLLM's older name of structured_outputs.regex")
    guided_choice: list | None = Field(default=None, description="vLLM's older name of structured_outputs.choice")
    guided_grammar: StrictStr | None = Field(
        default=None, description="vLLM's older name of structured_outputs.grammar"
    )

    def constraint(self) -> Constraint | None:
        """The output constraint the request asks for (None: free text); ConstraintError naming the field
        for an invalid or unsupported one, or for more than one."""
        asked = []
        if self.response_format is not None:
            constraint = constraint_from_response_format(self.response_format)
            if constraint is not None:
                asked.append(("response_format", constraint))
        if self.structured_outputs is not None:
            asked += self.structured_outputs.constraints()
        for kind, name in (("json_schema", "json"), ("regex", "regex"), ("choice", "choice"), ("grammar", "grammar")):
            value = getattr(self, f"guided_{name}")
            if value is not None:
                asked.append((f"guided_{name}", compile_constraint(kind, value, f"guided_{name}")))
        if len(asked) > 1:
            fields = ", ".join(param for param, _ in asked)
            raise ConstraintError(asked[1][0], f"give one output constraint, got {fields}")
        return asked[0][1] if asked else None

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @field_validator("max_tokens", "n_predict")
    @classmethod
    def _limit_not_zero(cls, value: int | None, info) -> int | None:
        if value == 0:  # (llama-server evaluates the prompt only: not a generation this server makes)
            raise ValueError(f"{info.field_name} must be -1 (no limit) or at least 1")
        return value

    def asked_max_tokens(self, room: int) -> int | None:
        """The limit the request gives, by OpenAI's name or llama-server's, -1 meaning `room` (what the
        context leaves after the prompt); None: none."""
        for value in (self.max_tokens, self.n_predict):
            if value is not None:
                return room if value == -1 else value
        return None

    def resolved_max_tokens(self, room: int) -> int:
        """The tokens to generate at most: what the request asks for, else its endpoint's default."""
        return self.asked_max_tokens(room) or room

    def sampling_params(self, room: int, constraint: Constraint | None = None) -> SamplingParams:
        """The request's SamplingParams (`room`: tokens the context leaves after the prompt). ValueError
        (with the field's name) for values SamplingParams rejects, e.g. a top_p that is 0 in float32."""
        max_tokens = self.resolved_max_tokens(room)
        return SamplingParams(
            temperature=1.0 if self.temperature is None else float(self.temperature),
            top_k=self.top_k,
            top_p=1.0 if self.top_p is None else float(self.top_p),
            min_p=float(self.min_p),
            seed=self.seed,
            max_tokens=max_tokens,
            stop=self.stop_strings(),
            ignore_eos=self.ignore_eos,
            constraint=constraint,
            logprobs=self.logprobs_count(),
            presence_penalty=float(self.presence_penalty or 0.0),
            frequency_penalty=float(self.frequency_penalty or 0.0),
            repetition_penalty=1.0 if self.repetition_penalty is None else float(self.repetition_penalty),
        )

    def logprobs_count(self) -> int | None:
        """Alternatives to report per token (0: the chosen token's logprob only); None: no logprobs."""
        return None


class CompletionRequest(GenerationRequest):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: (
        StrictStr
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[StrictStr], Field(min_length=1, max_length=1)]
    )
    logprobs: JsonInt | None = Field(default=None, ge=0, le=5)

    def resolved_max_tokens(self, room: int) -> int:
        return self.asked_max_tokens(room) or 16  # OpenAI's default for completions

    def logprobs_count(self) -> int | None:
        return self.logprobs


class ChatCompletionRequest(GenerationRequest, ToolChatFields):
    """POST /v1/chat/completions: messages told apart by role (a `tool` message needs `tool_call_id` and
    content), `tools`, `tool_choice`, `parallel_tool_calls` (server/tool_protocol.py), and
    `chat_template_kwargs` for the template."""

    model_config = REQUEST_CONFIG  # (ToolChatFields' config would win otherwise)
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: JsonInt | None = Field(default=None, ge=0, le=20)
    # The chat template's own variables (Qwen3's enable_thinking), as vLLM and llama-server take them.
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_template_kwargs(value)
        return value

    def resolved_max_tokens(self, room: int) -> int:
        return self.max_completion_tokens or self.asked_max_tokens(room) or room  # chat: up to the context by default

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def uses_tools(self) -> bool:
        """Tools are offered (and the reply is parsed for calls)."""
        return bool(self.tools) and self.resolved_tool_choice() != "none"

    def has_tool_messages(self) -> bool:
        """The conversation carries calls or their results (rendered the tool way even without tools)."""
        return any(m.role == "tool" or getattr(m, "tool_calls", None) for m in self.messages)


# -- responses (what the OpenAPI document promises; routes build them as dicts) -------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None = None
    finish_reason: Literal["stop", "length", "tool_calls", "grammar_dead_end"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: dict


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict | None = None
    finish_reason: Literal["stop", "length", "tool_calls", "grammar_dead_end"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    """The OpenAI error envelope."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
