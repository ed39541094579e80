"""Fuzzing structured outputs through a running server: JSON schemas drawn from a hypothesis strategy
(objects of strings, integers, numbers, booleans, enums, arrays and nested objects, with required keys,
bounds and lengths), regexes, choices and grammars, on both endpoints, greedy and sampled, plus invalid
constraints. Every answer must be a 200 or an OpenAI 4xx (never a 5xx, never a dead engine), and every
output with finish_reason "stop" must be valid against its constraint. Shared by
tests/server/test_structured_fuzz.py (a bounded run) and benchmarks/structured_fuzz/fuzz.py (>= 500)."""

from __future__ import annotations

import json
import re
import time

import httpx
import jsonschema
from hypothesis import strategies as st

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


def _leaf() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.builds(
            lambda n: {"type": "string", **n}, st.fixed_dictionaries({}, optional={"maxLength": st.integers(1, 12)})
        ),
        st.builds(
            lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
            st.integers(-100, 100),
            st.integers(0, 1000),
        ),
        st.just({"type": "integer"}),
        st.just({"type": "number"}),
        st.just({"type": "boolean"}),
        st.builds(lambda v: {"enum": v}, st.lists(NAMES, min_size=1, max_size=4, unique=True)),
    )


def _object(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    def build(props: dict, data) -> dict:
        required = sorted(k for k in props if data[k])
        return {"type": "object", "properties": props, "required": required, "additionalProperties": False}

    return st.dictionaries(NAMES, children, min_size=1, max_size=4).flatmap(
        lambda props: st.fixed_dictionaries({k: st.booleans() for k in props}).map(lambda d: build(props, d))
    )


SCHEMAS = st.recursive(
    _leaf(),
    lambda children: st.one_of(
        _object(children),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, children, st.integers(1, 3)),
    ),
    max_leaves=6,
).filter(lambda s: s.get("type") in ("object", "array") or "enum" in s)

REGEXES = [r"[a-z]{1,8}", r"(yes|no)", r"[0-9]{2,4}-[0-9]{2}", r" ?[A-Z][a-z]+( [a-z]+){0,3}\."]
CHOICES = [["red", "green", "blue"], ["Once upon a time", "One day"], ["a", "ab", "abc"]]
GRAMMARS = ['start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]+/', 'root ::= "x" | "y" "z"']
INVALID = [
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/defs/none"}}}),
    ("response_format", {"type": "yaml"}),
    ("structured_outputs", {"regex": "(a"}),
    ("structured_outputs", {"grammar": "start: missing"}),
    ("structured_outputs", {"choice": []}),
    ("guided_regex", ""),
]


def _valid(kind: str, value, text: str) -> bool:
    try:
        if kind == "json":
            jsonschema.validate(json.loads(text), value)
        elif kind == "regex":
            return re.fullmatch(value, text) is not None
        elif kind == "choice":
            return text in value
        return True  # grammars: llguidance's own verdict (the matcher ended accepting)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def fuzz_structured(url: str, cases: int = 500, seed: int = 0, max_tokens: int = 48, chat: bool = True) -> dict:
    """Run `cases` requests (half of them chat ones with `chat`); returns {"cases", "statuses",
    "finish_reasons", "invalid", "failures", "seconds"}."""
    import random

    rng = random.Random(seed)
    schemas: list[dict] = []  # drawn by hypothesis, reproducibly (derandomize)
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=cases, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(SCHEMAS)
    def collect(schema):
        schemas.append(schema)

    collect()
    statuses: dict[str, int] = {}
    reasons: dict[str, int] = {}
    invalid: list[str] = []
    failures: list[str] = []
    t0 = time.perf_counter()
    for i in range(cases):
        roll = rng.random()
        if roll < 0.6:
            kind, value = "json", schemas[i % len(schemas)]
            field = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": value}}}
            if rng.random() < 0.3:
                field = {"structured_outputs": {"json": value}}
        elif roll < 0.7:
            kind, value = "regex", rng.choice(REGEXES)
            field = {"structured_outputs": {"regex": value}}
        elif roll < 0.8:
            kind, value = "choice", rng.choice(CHOICES)
            field = {"guided_choice": value}
        elif roll < 0.88:
            kind, value = "grammar", rng.choice(GRAMMARS)
            field = {"structured_outputs": {"grammar": value}}
        elif roll < 0.95:
            kind, value = "invalid", None
            name, bad = rng.choice(INVALID)
            field = {name: bad}
        else:
            kind, value = "json_object", None
            field = {"response_format": {"type": "json_object"}}
        sampling = {"temperature": rng.choice([0, 0, 0.7, 1.0]), "seed": rng.randrange(1000), "max_tokens": max_tokens}
        if rng.random() < 0.5 or not chat:
            path, body = "/v1/completions", {"prompt": rng.choice(["Once upon a time", "{", "The answer:"])}
        else:
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "Answer in the format."}]}
        body = {**body, **sampling, **field}
        try:
            r = httpx.post(url + path, json=body, timeout=120)
        except httpx.HTTPError as e:
            failures.append(f"{path} {json.dumps(body)[:300]}: {type(e).__name__}")
            continue
        statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
        if r.status_code >= 500 or (kind == "invalid") != (r.status_code == 400):
            failures.append(f"{r.status_code} {path} {json.dumps(body)[:300]}: {r.text[:300]}")
            continue
        if r.status_code != 200:
            continue
        choice = r.json()["choices"][0]
        text = choice["text"] if path == "/v1/completions" else choice["message"]["content"]
        reasons[choice["finish_reason"]] = reasons.get(choice["finish_reason"], 0) + 1
        if choice["finish_reason"] == "stop":
            ok = _valid(kind, value, text) if kind != "json_object" else isinstance(_loads(text), dict)
            if not ok:
                invalid.append(f"{kind} {json.dumps(value)[:200]} -> {text[:200]!r}")
    health = httpx.get(url + "/health", timeout=30)
    if health.status_code != 200:
        failures.append(f"engine dead after the run: /health {health.status_code}")
    return {
        "cases": cases,
        "statuses": statuses,
        "finish_reasons": reasons,
        "invalid": invalid,
        "failures": failures,
        "seconds": time.perf_counter() - t0,
    }


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None
