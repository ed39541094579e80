"""`speclm bench serve`'s per-category table: the overall row weighs requests by their time, the median
row takes each ratio request by request, and ratio columns keep both sides' names."""

from speclm.bench.serve_categories import MEDIAN, OVERALL, category_markdown, category_results


def _level(tokens: list[int], seconds: list[float]) -> dict:
    return {"concurrency": 1, "request_tokens": tokens, "request_seconds": seconds}


def test_overall_and_median_rows():
    # Three requests, categories a, b, c. Per request, speclm's draft mode runs 2x, 1x and 4x plain;
    # plain runs 1x, 2x and 1x llama-server.
    results = {
        "no speculation": [_level([100, 100, 100], [10.0, 5.0, 20.0])],
        "draft:/m/d.gguf (K=4, adaptive)": [_level([100, 100, 100], [5.0, 5.0, 5.0])],
        "llama-server": [_level([100, 100, 100], [10.0, 10.0, 20.0])],
    }
    modes = ["no speculation", "draft:/m/d.gguf (K=4, adaptive)"]
    table = category_results(results, {}, ["a", "b", "c"], modes)[1]
    assert list(table) == ["a", "b", "c", OVERALL, MEDIAN]
    draft_over_plain = "draft:/m/d.gguf (K=4, adaptive) / no speculation"
    assert table["b"]["ratios"][draft_over_plain] == 1.0
    assert abs(table[OVERALL]["ratios"][draft_over_plain] - 35.0 / 15.0) < 1e-9  # all tokens over all time
    assert table[MEDIAN]["ratios"][draft_over_plain] == 2.0  # median of 2, 1, 4
    assert table[MEDIAN]["tokens_per_s"]["no speculation"] == 10.0  # median of 10, 20, 5
    assert table[MEDIAN]["ratios"]["no speculation / llama-server"] == 1.0  # median of 1, 2, 1
    markdown = "\n".join(category_markdown({1: table}))
    assert "| draft:d.gguf (K=4, adaptive) / no speculation |" in markdown
    assert "| **median of requests** | 10.0 | 20.0 | 10.0 | 2.00x |" in markdown
