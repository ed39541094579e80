"""Golden output: stories260K, greedy from BOS alone, must produce the known text exactly."""

from speclm import SamplingParams
from tests.conftest import STORIES_GOLDEN


def test_stories260k_greedy_from_bos_is_golden(stories_llm):
    out = stories_llm.generate("", SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert out.text.startswith(STORIES_GOLDEN), out.text
    assert out.token_ids[:6] == [403, 407, 261, 378, 432, 383]
    assert out.finish_reason == "length"
    assert out.stats.completion_tokens == 40 == len(out.token_ids)
