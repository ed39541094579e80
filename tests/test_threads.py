"""Default thread count: the cores other processes leave idle, at least one, with a warning when lowered."""

import logging
import os

from speclm import threads


def test_idle_cores_is_a_share_of_the_machine():
    idle = threads.idle_cores(0.02)
    assert idle is None or 0.0 <= idle <= (os.cpu_count() or 1)


def test_busy_machine_lowers_threads_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(threads, "TORCH_THREADS", 4)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads, "idle_cores", lambda: 1.1)
    with caplog.at_level(logging.WARNING, logger="speclm.threads"):
        assert threads.default_threads() == 1
    assert "computing with 1 thread" in caplog.text and "--threads" in caplog.text
    monkeypatch.setattr(threads, "idle_cores", lambda: 0.0)
    assert threads.default_threads() == 1  # never 0
    caplog.clear()
    monkeypatch.setattr(threads, "idle_cores", lambda: 3.8)
    with caplog.at_level(logging.WARNING, logger="speclm.threads"):
        assert threads.default_threads() == 4
    assert not caplog.text  # a quiet machine: torch's default, no warning
    monkeypatch.setattr(threads, "idle_cores", lambda: None)  # no /proc/stat
    assert threads.default_threads() == 4
