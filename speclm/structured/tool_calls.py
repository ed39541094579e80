"""The model's tool calls, parsed into OpenAI `tool_calls`: all at once for a finished reply, or as
stream deltas while it is generated."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from speclm.structured.tools import GENERIC, HERMES, TOOL_CALL_CLOSE, TOOL_CALL_OPEN


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedReply:
    """content (None when the reply is only calls) and OpenAI tool_calls."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


def openai_call(name: str, arguments: object, call_id: str) -> dict:
    """One OpenAI tool call; arguments as a JSON string (as OpenAI returns them)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _call_of(obj: object) -> tuple[str, object] | None:
    if isinstance(obj, dict) and isinstance(obj.get("name"), str) and set(obj) <= {"name", "arguments"}:
        return obj["name"], obj.get("arguments", {})
    return None


def parse_tool_calls(text: str, fmt: str, new_id: Callable[[], str] = new_call_id) -> ParsedReply:
    """The content and tool calls of a finished reply. Text that is not a well-formed call stays content."""
    if fmt == GENERIC:
        return _parse_generic(text, new_id)
    assert fmt == HERMES, fmt
    content, calls, rest = [], [], text
    while TOOL_CALL_OPEN in rest:
        before, _, after = rest.partition(TOOL_CALL_OPEN)
        body, closed, rest = after.partition(TOOL_CALL_CLOSE)
        call = _call_of(_loads(body))
        if call is None:  # not a call: keep the text as the model wrote it
            content.append(before + TOOL_CALL_OPEN + body + (TOOL_CALL_CLOSE if closed else ""))
            continue
        content.append(before)
        calls.append(openai_call(call[0], call[1], new_id()))
    content.append(rest)
    joined = "".join(content)
    # Whitespace around calls is not content; any other text is kept exactly as written.
    return ParsedReply(joined if joined.strip() or not calls else None, calls)


def _parse_generic(text: str, new_id: Callable[[], str]) -> ParsedReply:
    obj = _loads(text)
    if isinstance(obj, dict) and len(obj) == 1:
        if isinstance(obj.get("response"), str):
            return ParsedReply(obj["response"])
        calls = [obj["tool_call"]] if "tool_call" in obj else obj.get("tool_calls")
        parsed = [_call_of(c) for c in calls] if isinstance(calls, list) and calls else [None]
        if all(p is not None for p in parsed):
            return ParsedReply(None, [openai_call(name, args, new_id()) for name, args in parsed])
    return ParsedReply(text)


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


class ToolCallStream:
    """Turns a reply's text deltas into OpenAI chat-completion deltas: {"content": ...} and
    {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}.

    Content streams as it comes (text that may be the start of a <tool_call> tag is held back); a call
    is sent whole, in one delta, when its closing tag arrives (or at the end), so that the deltas of a
    reply always add up to parse_tool_calls' result: a tag whose body is not a call is content there too."""

    def __init__(self, fmt: str, new_id: Callable[[], str] = new_call_id) -> None:
        self.fmt = fmt
        self.new_id = new_id
        self.buffer = ""  # text not yet emitted
        self.in_call = False
        self.num_calls = 0
        self.content_sent = False
        self.pending_space = ""  # whitespace-only content: dropped if the reply turns out to be only calls

    def feed(self, delta: str) -> list[dict]:
        """Deltas for the next piece of text."""
        self.buffer += delta
        out: list[dict] = []
        while self.fmt == HERMES:  # GENERIC: one JSON object, known only once complete
            if not self.in_call:
                at = self.buffer.find(TOOL_CALL_OPEN)
                if at < 0:
                    keep = _partial_suffix(self.buffer, TOOL_CALL_OPEN)
                    self._content(out, self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep :]
                    break
                self._content(out, self.buffer[:at])
                self.buffer, self.in_call = self.buffer[at + len(TOOL_CALL_OPEN) :], True
            at = self.buffer.find(TOOL_CALL_CLOSE)
            if at < 0:
                break
            body, self.buffer = self.buffer[:at], self.buffer[at + len(TOOL_CALL_CLOSE) :]
            self._close(out, body, closed=True)
        return out

    def finish(self) -> list[dict]:
        """Deltas for whatever the reply ended with (an unclosed call, held-back text)."""
        out: list[dict] = []
        if self.fmt == GENERIC:
            parsed = _parse_generic(self.buffer, self.new_id)
            if parsed.content is not None:
                out.append({"content": parsed.content})
            out += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(parsed.tool_calls)]
        elif self.in_call:
            self._close(out, self.buffer, closed=False)
        else:
            self._content(out, self.buffer)
        if self.pending_space and (self.content_sent or not self.num_calls):
            out.append({"content": self.pending_space})
        self.buffer, self.pending_space = "", ""
        return out

    def _close(self, out: list[dict], body: str, closed: bool) -> None:
        self.in_call = False
        call = _call_of(_loads(body))
        if call is None:  # not a call after all: the model's text, as parse_tool_calls keeps it
            self._content(out, TOOL_CALL_OPEN + body + (TOOL_CALL_CLOSE if closed else ""))
            return
        out.append({"tool_calls": [{"index": self.num_calls, **openai_call(*call, self.new_id())}]})
        self.num_calls += 1

    def _content(self, out: list[dict], text: str) -> None:
        if not (self.pending_space + text).strip():
            self.pending_space += text
            return
        out.append({"content": self.pending_space + text})
        self.pending_space, self.content_sent = "", True


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (it may become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
