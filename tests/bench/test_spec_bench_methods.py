"""speclm bench's method strings: AR, a --spec value, and METHOD@K for a fixed K."""

from speclm.bench.report import short_label
from speclm.bench.spec_bench import parse_method


def test_methods_parse_to_spec_k_and_adaptivity():
    assert parse_method("ar", 6, True) == (None, 6, True)
    assert parse_method("ngram", 6, True) == ("ngram", 6, True)
    assert parse_method("draft:/m/d.gguf,vocab=0@5", 6, True) == ("draft:/m/d.gguf,vocab=0", 5, False)
    assert parse_method("draft:/m/x@y.gguf", 6, True) == ("draft:/m/x@y.gguf", 6, True)  # not a K


def test_labels_drop_folders():
    assert short_label("draft:/root/.cache/pair/d.gguf,weights=q4_0@3") == "draft:d.gguf,weights=q4_0@3"
