"""Default thread count: the cores other processes leave idle, at least one, with a warning when lowered."""

import logging

from speclm import threads


def test_idle_cores_is_the_idle_share_of_the_sample_times_the_cores(monkeypatch):
    samples = iter([(100, 1000), (150, 1100)])  # (idle, total) jiffies: 50 of 100 idle
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    assert threads.idle_cores(0.0) == 2.0
    for missing in ([None], [(100, 1000), None], [(100, 1000), (100, 1000)]):  # no /proc/stat, no time passed
        samples = iter(missing)
        assert threads.idle_cores(0.0) is None


def test_cpu_times_reads_proc_stat(monkeypatch, tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 1 20 300 5 0 4 2 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    real_open = open

    def fake_open(path, *args, **kwargs):
        return real_open(stat if path == "/proc/stat" else path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert threads._cpu_times() == (305, 342)  # idle + iowait; user .. steal (guest 7 is in user already)
    stat.unlink()
    assert threads._cpu_times() is None


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
