"""matplotlib is the `bench` extra: the plot imports it when it is made, and its absence names the extra."""

import sys

import pytest

from speclm.bench.report import pyplot


def test_a_missing_matplotlib_names_the_bench_extra(monkeypatch):
    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the extra looks like
    with pytest.raises(ImportError, match=r"pip install 'speclm\[bench\]'"):
        pyplot()
