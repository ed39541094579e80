"""Benchmark prompt files: several may be combined, and a category asked for must be in one of them."""

import pytest

from speclm.data import CODING_PROMPTS, SPECBENCH_PROMPTS, load_prompts

BOTH = f"{CODING_PROMPTS},{SPECBENCH_PROMPTS}"


def test_combined_files_give_each_category_asked_for_even_where_one_file_has_none():
    prompts = load_prompts(BOTH, per_category=2, categories=["qa", "code"])
    assert sorted(p["category"] for p in prompts) == ["code", "code", "qa", "qa"]
    assert [p["category"] for p in load_prompts(BOTH, 1, ["translation"])] == ["translation"]  # none in the coding file


def test_a_category_in_no_file_is_named_in_the_error():
    with pytest.raises(ValueError, match="no prompts of category qaa"):
        load_prompts(BOTH, 1, ["qa", "qaa"])
