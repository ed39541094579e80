"""OpenAI's chat messages with tool calls, `tools`, `tool_choice` and `parallel_tool_calls` (pydantic),
and the checks OpenAI makes across them, so a bad conversation is a 400 before any model work.

Messages are told apart by `role`: a `tool` message needs `tool_call_id` and content, an assistant
message needs content or `tool_calls`, and `{"role": "tool"}` alone is refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictStr, model_validator

from speclm.structured.tools import check_tools

FunctionName = Annotated[str, Strict(), Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
MAX_TOOLS = 128  # OpenAI's limit


class ToolRequestError(ValueError):
    """A tool request OpenAI would refuse; `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Model):
    type: Literal["text"]
    text: StrictStr


Content = StrictStr | list[ContentPart]


class FunctionDefinition(_Model):
    name: FunctionName
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None = no parameters
    strict: StrictBool | None = None


class ToolDefinition(_Model):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionChoice(_Model):
    name: StrictStr


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: FunctionChoice


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Model):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI returns it


class ToolCall(_Model):
    id: StrictStr
    type: Literal["function"]
    function: FunctionCall


class SystemMessage(_Model):
    role: Literal["system"]
    content: Content
    name: StrictStr | None = None


class DeveloperMessage(_Model):
    role: Literal["developer"]
    content: Content
    name: StrictStr | None = None


class UserMessage(_Model):
    role: Literal["user"]
    content: Content
    name: StrictStr | None = None


class AssistantMessage(_Model):
    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCall] | None = None
    name: StrictStr | None = None

    @model_validator(mode="after")
    def _content_or_calls(self) -> AssistantMessage:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        return self


class ToolMessage(_Model):
    role: Literal["tool"]
    content: Content
    tool_call_id: StrictStr


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")
]


class ToolChatFields(_Model):
    """The chat request's message and tool fields (to join ChatCompletionRequest)."""

    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool = True

    def resolved_tool_choice(self) -> str | dict:
        """tool_choice as the structured package takes it; OpenAI's default is auto with tools, else none."""
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice if isinstance(self.tool_choice, str) else self.tool_choice.model_dump()

    def tool_dicts(self) -> list[dict]:
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def message_dicts(self) -> list[dict]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


def check_tool_request(request: ToolChatFields) -> None:
    """The checks OpenAI makes across fields; ToolRequestError (or ConstraintError for a parameter
    schema that does not compile) naming the field."""
    tools = request.tools or []
    if request.tool_choice is not None and not tools:
        raise ToolRequestError("tool_choice", "tool_choice is only allowed when tools are specified")
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ToolRequestError(f"tools.{i}.function.name", f"duplicate function name {name!r}")
    if isinstance(request.tool_choice, NamedToolChoice) and request.tool_choice.function.name not in names:
        raise ToolRequestError(
            "tool_choice.function.name", f"no function named {request.tool_choice.function.name!r} in tools"
        )
    check_tools(request.tool_dicts())
    check_tool_messages(request.messages)


def check_tool_messages(messages: list) -> None:
    """Each tool message answers a call of the assistant message before it (and each call is answered)."""
    waiting: list[str] = []  # call ids of the last assistant message not yet answered
    for i, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if message.tool_call_id not in waiting:
                raise ToolRequestError(
                    f"messages.{i}.tool_call_id",
                    "messages with role 'tool' must be a response to a preceding message with 'tool_calls' "
                    f"(no call with id {message.tool_call_id!r} is waiting for a result)",
                )
            waiting.remove(message.tool_call_id)
            continue
        if waiting:
            raise ToolRequestError(
                f"messages.{i}",
                "an assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id' (missing: {', '.join(waiting)})",
            )
        if isinstance(message, AssistantMessage) and message.tool_calls:
            waiting = [call.id for call in message.tool_calls]
            if len(set(waiting)) != len(waiting):
                raise ToolRequestError(f"messages.{i}.tool_calls", "tool call ids must be unique")
    if waiting:
        raise ToolRequestError(
            f"messages.{len(messages)}",
            f"an assistant message with 'tool_calls' must be followed by tool messages (missing: {', '.join(waiting)})",
        )
