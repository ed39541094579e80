"""Tools in the prompt and in the grammar: how a request's `tools` reach the model (its own chat template,
or a generic JSON tool prompt for templates without tool support, as llama.cpp's server does) and the
constraint a `tool_choice` of `required`, a named function, or a generic-format request puts on the reply.

Inputs are OpenAI's shapes as plain dicts, already checked at the edge (speclm.server.tool_protocol):
tools = [{"type": "function", "function": {"name", "description", "parameters", "strict"}}],
tool_choice = "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}.
"""

from __future__ import annotations

import json

from speclm.structured.grammar import JSON_OPTIONS, Constraint, ConstraintError, compile_constraint, tokens_grammar
from speclm.tokenizer import Tokenizer

HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Hermes templates)
GENERIC = "generic"  # the whole reply is one JSON object (templates without tool support)
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def tool_format(chat_template: str | None) -> str:
    """HERMES when the template takes `tools` and writes Hermes-style <tool_call> tags, else GENERIC."""
    if not chat_template or TOOL_CALL_OPEN not in chat_template:
        return GENERIC
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    return HERMES if "tools" in meta.find_undeclared_variables(env.parse(chat_template)) else GENERIC


def function_schema(tool: dict) -> dict:
    """The JSON schema a call's arguments must follow (an empty object when the function takes none)."""
    return tool["function"].get("parameters") or EMPTY_PARAMETERS


def check_tools(tools: list[dict]) -> None:
    """ConstraintError naming tools[i].function.parameters when a function's schema does not compile."""
    for i, tool in enumerate(tools):
        compile_constraint("json_schema", function_schema(tool), f"tools.{i}.function.parameters")


def offered_tools(tools: list[dict], tool_choice: str | dict) -> list[dict]:
    """The tools the reply may call: all of them, only the named one, or none."""
    if tool_choice == "none":
        return []
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        return [t for t in tools if t["function"]["name"] == name]
    return tools


def call_schema(tools: list[dict], strict_only: bool = False) -> dict:
    """The JSON schema of one call, {"name": <one of the tools>, "arguments": <its parameters>}; with
    `strict_only` the arguments of a function without `strict: true` are any JSON object."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": function_schema(t)
                if t["function"].get("strict") or not strict_only
                else {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def generic_reply_schema(tools: list[dict], tool_choice: str | dict, parallel: bool) -> dict:
    """The JSON schema of a whole reply in the generic format."""
    call = call_schema(offered_tools(tools, tool_choice))
    if parallel:
        calls = {"type": "array", "items": call, "minItems": 1}
        call_reply = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"]}
    else:
        call_reply = {"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]}
    call_reply["additionalProperties"] = False
    if tool_choice != "auto":
        return call_reply
    response = {
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    return {"anyOf": [call_reply, response]}


def tool_constraint(
    tokenizer: Tokenizer, fmt: str, tools: list[dict], tool_choice: str | dict, parallel: bool
) -> Constraint | None:
    """The constraint on a reply that may call tools; None where the reply is free text.

    GENERIC: always the reply schema (the model cannot know the format otherwise). HERMES: `required`
    or a named function force one call (several with parallel_tool_calls) whose arguments follow the
    function's parameter schema; `auto` leaves the reply free (calls are parsed from it) unless a tool
    is `strict`: then free text until the model opens a call, the call's name one of the tools and the
    arguments of a strict function its parameter schema (a lazy grammar, triggered by the tag)."""
    if not tools or tool_choice == "none":
        return None
    if fmt == GENERIC:
        return compile_constraint("json_schema", generic_reply_schema(tools, tool_choice, parallel), "tools")
    auto = tool_choice == "auto"
    if auto and not any(t["function"].get("strict") for t in tools):
        return None
    # Qwen's tokenizers have one token for each tag: a Lark literal would not match it (llguidance
    # reads tokens of added tokens as special), the <token> form does.
    has_tags = tokenizer.token_to_id(TOOL_CALL_OPEN) is not None and tokenizer.token_to_id(TOOL_CALL_CLOSE) is not None
    tag_open, tag_close = (
        (TOOL_CALL_OPEN, TOOL_CALL_CLOSE) if has_tags else (f'"{TOOL_CALL_OPEN}"', f'"{TOOL_CALL_CLOSE}"')
    )
    # Inside Lark, JSON options travel in the schema's "x-guidance" (the same as response_format's).
    schema = json.dumps({**call_schema(offered_tools(tools, tool_choice), auto), "x-guidance": JSON_OPTIONS})
    body = f'"\\n" arguments "\\n" {tag_close}'  # after the opening tag
    if not auto:
        # the model may end its line before it ends the turn (Qwen2.5 writes "</tool_call>\n<|endoftext|>"):
        # without the optional newline a newline could only open another call, and greedy calls ran away
        calls = 'call ("\\n" call)*' if parallel else "call"
        start = [f'start: {calls} "\\n"?', f"call: {tag_open} {body}"]
    elif has_tags:  # free text ends where the model writes the tag's token
        start = [f"start: call{'*' if parallel else '?'} TEXT", f"call: TEXT {tag_open} {body}"]
    else:  # a lazy lexeme: the text up to the first tag, wherever it is (without parallel_tool_calls, a
        # second tag after the call is free text: a tag spelled as text cannot be kept out of TEXT cheaply)
        start = [f"start: call{'*' if parallel else '?'} TEXT", f"call: call_open {body}"]
        start.append(f"call_open[lazy]: TEXT {tag_open}")
    lark = "\n".join(
        (["%llguidance {}"] if auto else [])
        + start
        + [f"arguments: %json {schema}"]
        + (["TEXT: /(.|\\n)*/"] if auto else [])
    )
    try:
        return tokens_grammar(lark, "tools")
    except ConstraintError as e:  # a schema llguidance accepts alone but not inside Lark: name the field
        raise ConstraintError("tools", e.message) from e


# -- prompts ----------------------------------------------------------------------------------------
def render_tool_prompt(
    tokenizer: Tokenizer,
    messages: list[dict],
    tools: list[dict] | None,
    tool_choice: str | dict,
    parallel: bool,
    template_kwargs: dict | None = None,
) -> str:
    """The prompt text of a conversation that may carry tools, tool calls and tool results.

    messages are OpenAI messages as dicts (assistant `tool_calls` with JSON-string arguments, `tool`
    messages with `tool_call_id`). HERMES templates get `tools` and the calls with parsed arguments;
    other templates get the generic tool system prompt and calls/results written as JSON text.
    `template_kwargs`: the template's own variables (chat_template_kwargs)."""
    fmt = tool_format(tokenizer.chat_template)
    offered = offered_tools(tools or [], tool_choice)
    if fmt == HERMES:
        return tokenizer.apply_chat_template(
            hermes_messages(messages), tools=offered or None, template_kwargs=template_kwargs
        )
    generic = generic_messages(messages, offered, tool_choice, parallel)
    return tokenizer.apply_chat_template(generic, template_kwargs=template_kwargs)


def hermes_messages(messages: list[dict]) -> list[dict]:
    """Messages for a template that takes tools: arguments as objects (as transformers passes them)."""
    out = []
    for m in messages:
        m = dict(m, content=_text(m.get("content")))
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def generic_system_prompt(tools: list[dict], tool_choice: str | dict, parallel: bool) -> str:
    """The tool prompt for templates without tool support: the tools and the reply's JSON format."""
    lines = ["You can call the following tools:"]
    lines += [json.dumps(t["function"], ensure_ascii=False) for t in tools]
    call = '{"name": <tool name>, "arguments": <arguments object>}'
    how = f'{{"tool_calls": [{call}, ...]}}' if parallel else f'{{"tool_call": {call}}}'
    lines.append(f"\nRespond with one JSON object: {how} to call a tool")
    if tool_choice == "auto":
        lines[-1] += ', or {"response": <your reply to the user>} to answer directly'
    lines[-1] += "."
    return "\n".join(lines)


def generic_messages(messages: list[dict], tools: list[dict], tool_choice: str | dict, parallel: bool) -> list[dict]:
    """Messages for a template without tool support: the tool prompt in the system message, earlier
    calls as the JSON the model would have written, tool results as user messages in JSON."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
    out = []
    for m in messages:
        if m["role"] == "tool":
            result = {
                "tool_call_id": m["tool_call_id"],
                "name": names.get(m["tool_call_id"]),
                "content": _text(m["content"]),
            }
            out.append({"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)})
        elif m.get("tool_calls"):
            calls = [
                {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
                for c in m["tool_calls"]
            ]
            reply = {"tool_calls": calls} if parallel or len(calls) > 1 else {"tool_call": calls[0]}
            out.append({"role": "assistant", "content": json.dumps(reply, ensure_ascii=False)})
        else:
            out.append({"role": m["role"], "content": _text(m.get("content"))})
    if tools:
        prompt = generic_system_prompt(tools, tool_choice, parallel)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _text(content: str | list | None) -> str:
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return content or ""


def _arguments(arguments: str | dict) -> dict | str:
    """OpenAI's arguments are a JSON string; templates expect the object (kept as text if not JSON)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
