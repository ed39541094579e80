"""`speclm deploy` on a local Ray instance (loopback, 2 CPUs, bounded times), with the tiny stories260K model as
both target and draft: greedy output equals the in-process engine's, a dead draft replica costs no tokens, a
dead target replica fails its request clearly and the service goes on."""

from __future__ import annotations

import faulthandler
import json
import socket
import time

import pytest

from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

ray = pytest.importorskip("ray", reason="ray[serve] is not installed (pip install 'speclm[deploy]')")
pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install 'speclm[deploy]')")
httpx = pytest.importorskip("httpx")

MODULE_DEADLINE_S = 420  # a hung Ray must not hang CI: dump the stacks and exit past this
PROMPT = "Once upon a time"
LONG = {"max_tokens": 400, "ignore_eos": True}  # long enough that a replica can be killed mid-request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def deployment():
    """(base_url, launch module) of a running deployment; Serve and Ray are always shut down afterwards."""
    from speclm.deploy import launch
    from speclm.deploy.config import DeployConfig
    from speclm.server.config import ServerConfig

    faulthandler.dump_traceback_later(MODULE_DEADLINE_S, exit=True)
    config = DeployConfig(
        model=STORIES_MODEL,
        draft=STORIES_MODEL,
        tokenizer=STORIES_TOKENIZER,
        threads=1,
        max_draft_tokens=4,
        adaptive=False,  # always draft: the tests need draft calls to happen
        draft_timeout=5.0,
        server=ServerConfig(model_name="stories"),
    )
    port = free_port()
    launch.init_local_ray(num_cpus=2, log_to_driver=False)
    try:
        launch.start(config, "127.0.0.1", port)
        yield f"http://127.0.0.1:{port}", launch
    finally:
        launch.stop()
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def reference():
    """The in-process engine on the same pair: text of a greedy completion."""
    from speclm import LLM, SamplingParams

    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, spec=f"draft:{STORIES_MODEL}", threads=1)

    def complete(prompt: str, max_tokens: int, ignore_eos: bool = False) -> str:
        return llm.generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))[0].text

    return complete


def post(base: str, body: dict, timeout: float = 60.0) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", json={"model": "stories", **body}, timeout=timeout)


def draft_stats(launch) -> dict:
    return launch.target_handle().call_stats.remote().result(timeout_s=30)


def kill_replicas(deployment_name: str) -> int:
    """Kill every replica actor of a deployment (as a crash would); returns how many."""
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(f"SERVE_REPLICA::speclm#{deployment_name}#")
    ]
    for name in names:
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return len(names)


def stream_and_kill(base: str, body: dict, deployment_name: str) -> tuple[str, list[dict]]:
    """Stream a completion, kill the deployment's replicas after its first text arrives, read to the end:
    (the text, every event)."""
    text, events, killed = "", [], False
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            events.append(event)
            if "choices" in event and event["choices"]:
                text += event["choices"][0]["text"]
                if text and not killed:
                    assert kill_replicas(deployment_name) >= 1
                    killed = True
    assert killed, "no text arrived before the stream ended"
    return text, events


def test_greedy_output_equals_the_in_process_engine(deployment, reference):
    base, launch = deployment
    before = draft_stats(launch)
    for prompt, max_tokens in ((PROMPT, 64), ("The little dog", 40)):
        response = post(base, {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["choices"][0]["text"] == reference(prompt, max_tokens)
        assert body["usage"]["completion_tokens"] == max_tokens
    after = draft_stats(launch)
    assert after["calls"] > before["calls"], "the target never asked the draft service"
    assert after["failures"] == 0
    assert after["model_seconds"] <= after["call_seconds"]


def test_seeded_sampling_is_reproducible(deployment):
    base, _ = deployment
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0.9, "top_k": 20, "seed": 7}
    first, second = post(base, body).json(), post(base, body).json()
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert first["usage"]["completion_tokens"] >= 1


def test_bad_requests_get_openai_errors_and_the_service_goes_on(deployment, reference):
    base, _ = deployment
    bad = post(base, {"prompt": PROMPT, "temperature": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "temperature"
    too_long = post(base, {"prompt": list(range(1, 500)) * 2, "max_tokens": 4})
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
    models = httpx.get(f"{base}/v1/models", timeout=30).json()
    assert models["data"][0]["id"] == "stories"
    ok = post(base, {"prompt": PROMPT, "max_tokens": 16, "temperature": 0})
    assert ok.json()["choices"][0]["text"] == reference(PROMPT, 16)


def test_a_dead_draft_replica_turns_the_sequence_to_plain_decoding(deployment, reference):
    base, launch = deployment
    failures = draft_stats(launch)["failures"]
    text, events = stream_and_kill(base, {"prompt": PROMPT, "temperature": 0, **LONG}, "DraftService")
    assert not any("error" in e for e in events), events
    assert text == reference(PROMPT, LONG["max_tokens"], ignore_eos=True)
    assert draft_stats(launch)["failures"] > failures, "the draft was killed but no call failed"
    again = post(base, {"prompt": "The little dog", "max_tokens": 24, "temperature": 0})  # while Serve replaces it
    assert again.json()["choices"][0]["text"] == reference("The little dog", 24)


def test_a_dead_target_replica_fails_its_request_and_new_ones_are_served(deployment, reference):
    base, _ = deployment
    text, events = stream_and_kill(base, {"prompt": PROMPT, "temperature": 0, **LONG}, "TargetService")
    errors = [e["error"] for e in events if "error" in e]
    assert len(errors) == 1 and "target replica" in errors[0]["message"], events
    assert len(text) < len(reference(PROMPT, LONG["max_tokens"], ignore_eos=True))
    deadline = time.monotonic() + 120  # Serve starts a new target replica; the next request waits for it
    response = post(base, {"prompt": PROMPT, "max_tokens": 32, "temperature": 0}, timeout=120)
    assert time.monotonic() < deadline
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == reference(PROMPT, 32)


def test_sampled_tokens_through_the_services_follow_the_target_distribution(deployment):
    """G-test of the first three sampled tokens (the prompt pass's draw, then one drafted by the draft service
    and one from the target's verification) against the target's own distribution, enumerated; the same counts
    against a wrong distribution (twice the temperature) are rejected, so the test can tell the two apart."""
    from speclm import LLM, SamplingParams
    from tests.gtest import exact_sequences, g_test

    base, launch = deployment
    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, threads=1)
    ids = llm.tokenizer.encode(PROMPT)
    temperature, top_k, samples = 0.8, 4, 400

    prefix = llm.tokenizer.decode(ids)

    def by_text(sequences: dict) -> dict:  # what the server returns: the text the tokens add to the prompt's
        out: dict = {}
        for tokens, p in sequences.items():
            key = llm.tokenizer.decode([*ids, *tokens])[len(prefix) :]
            out[key] = out.get(key, 0.0) + p
        return out

    exact = by_text(exact_sequences(llm, ids, SamplingParams(temperature=temperature, top_k=top_k), 3))
    wrong = by_text(exact_sequences(llm, ids, SamplingParams(temperature=2 * temperature, top_k=top_k), 3))
    before = draft_stats(launch)["calls"]
    counts: dict = {}
    for seed in range(samples):
        body = {"prompt": ids, "max_tokens": 3, "temperature": temperature, "top_k": top_k, "seed": seed}
        response = post(base, {**body, "ignore_eos": True})
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["text"]
        counts[text] = counts.get(text, 0) + 1
    assert draft_stats(launch)["calls"] >= before + samples  # every request drafted its second token
    assert g_test(counts, exact, samples) > 1e-3
    assert g_test(counts, wrong, samples) < 1e-3
