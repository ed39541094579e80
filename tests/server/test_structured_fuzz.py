"""A bounded structured-output fuzz run (tests/structured_fuzz.py) against a server on stories260K: no
5xx, no dead engine, bad constraints are 400s, and every "stop" output is valid against its constraint."""

from speclm.config import CacheConfig
from tests.server.conftest import running_server
from tests.structured_fuzz import fuzz_structured


def test_structured_fuzz_bounded(stories_llm):
    with running_server(stories_llm.with_spec("ngram"), CacheConfig(kv_cache_mb=16)) as (url, _):
        result = fuzz_structured(url, cases=60, seed=1, max_tokens=32, chat=False)
    assert not result["failures"], result["failures"][:5]
    assert not result["invalid"], result["invalid"][:5]
    assert result["finish_reasons"].get("stop", 0) > 0
