"""speclm/server/launch.py: the engine loop on the calling thread, uvicorn on another, the URL reported
only once connections are accepted; and the ModelRunner's warning when a model runs off its loading thread."""

import asyncio
import logging
import socket
import threading

import pytest

from speclm.config import CacheConfig
from speclm.engine.model_runner import ThreadWatch
from speclm.server.app import build_app
from speclm.server.config import ServerConfig
from speclm.server.launch import serve_while


def _app(llm):
    return build_app(llm, CacheConfig(num_blocks=64), ServerConfig(model_name="test"))


def test_engine_steps_on_the_calling_thread_and_lifespan_starts_no_second_loop(stories_llm):
    import httpx

    app = _app(stories_llm)
    engine, stepped_on = app.state.engine.engine, set()
    step = engine.step

    def recording_step():
        stepped_on.add(threading.get_ident())
        return step()

    engine.step = recording_step

    def work(url: str) -> dict:
        assert app.state.engine.alive and app.state.engine._thread is None  # start() in the lifespan did nothing
        body = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
        return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()

    answer = serve_while(app, work)
    assert answer["usage"]["completion_tokens"] == 5
    assert stepped_on == {threading.get_ident()}
    assert not app.state.engine.alive  # stopped when the work was done


def test_the_url_is_reported_once_connections_are_accepted(stories_llm):
    def work(url: str) -> str:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5):  # no retry: refused would fail here
            return url

    assert serve_while(_app(stories_llm), work).startswith("http://127.0.0.1:")


def test_a_client_error_is_raised_on_the_calling_thread(stories_llm):
    def work(url: str):
        raise KeyError("client broke")

    with pytest.raises(KeyError, match="client broke"):
        serve_while(_app(stories_llm), work)


def test_thread_watch_warns_once_off_the_loading_thread(caplog):
    watch = ThreadWatch()
    with caplog.at_level(logging.WARNING, logger="speclm.engine.model_runner"):
        watch.observe()
        assert not watch.warned and not caplog.records
        for _ in range(2):
            thread = threading.Thread(target=watch.observe)
            thread.start()
            thread.join()
    assert watch.warned and len(caplog.records) == 1 and "was loaded on another" in caplog.records[0].message


def test_async_engine_run_forever_serves_until_stopped(stories_llm):
    from speclm.engine.async_engine import AsyncEngine
    from speclm.engine.engine import Engine
    from speclm.engine.request import Request
    from speclm.sampling_params import SamplingParams

    engine = AsyncEngine(Engine(stories_llm.runner, stories_llm.tokenizer, CacheConfig(num_blocks=64)))
    got = []

    async def client():
        request = Request("r", stories_llm.tokenizer.encode("Once"), SamplingParams(max_tokens=3, ignore_eos=True))
        async for out in engine.generate(request):
            got.extend(out.token_ids)
        engine.stop()

    engine.run_forever(ready=lambda: threading.Thread(target=asyncio.run, args=(client(),)).start())
    assert len(got) == 3 and not engine.alive
    with pytest.raises(RuntimeError, match="runs already"):
        engine.run_forever()  # one loop per AsyncEngine


def test_a_constrained_request_waits_for_the_grammar_off_the_engine_thread(stories_llm):
    """The grammar engine's vocabulary takes seconds to build for a big tokenizer: a constrained request
    that comes before it is built waits off the engine thread, and other requests go on meanwhile."""
    from speclm.engine.async_engine import AsyncEngine
    from speclm.engine.engine import Engine
    from speclm.engine.request import Request
    from speclm.sampling_params import SamplingParams
    from speclm.structured.grammar import compile_constraint

    engine = AsyncEngine(Engine(stories_llm.runner, stories_llm.tokenizer, CacheConfig(num_blocks=64)))
    built, build = threading.Event(), engine.engine.grammar_vocab

    def slow_build():
        assert built.wait(20), "the plain request did not finish while the grammar was building"
        return build()

    engine.engine.grammar_vocab = slow_build
    finished = []
    ids = stories_llm.tokenizer.encode("Once")
    constrained = SamplingParams(max_tokens=8, constraint=compile_constraint("regex", "[a-z ]+", "c"))

    async def one(name: str, params: SamplingParams) -> None:
        async for out in engine.generate(Request(name, ids, params)):
            if out.finished:
                finished.append(name)
        if name == "plain":
            built.set()

    async def client():
        try:
            task = asyncio.ensure_future(one("constrained", constrained))
            await asyncio.sleep(0.2)  # the constrained request is submitted first
            await asyncio.gather(task, one("plain", SamplingParams(max_tokens=3, ignore_eos=True)))
        finally:
            engine.stop()

    engine.run_forever(ready=lambda: threading.Thread(target=asyncio.run, args=(client(),)).start())
    assert finished == ["plain", "constrained"]
