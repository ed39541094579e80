"""The runner's slow-step watch: one warning when a decoding step is far slower than the fastest."""

import logging

from speclm.engine.model_runner import SlowStepWatch


def test_warns_once_on_a_step_far_slower_than_the_fastest(caplog):
    watch = SlowStepWatch(max_rows=8, factor=20.0, min_seconds=0.5)
    with caplog.at_level(logging.WARNING, logger="speclm.engine.model_runner"):
        watch.observe(1, 0.02)
        watch.observe(256, 5.0)  # a prefill chunk: not compared
        watch.observe(1, 0.3)  # slower, but under min_seconds
        assert not caplog.records
        watch.observe(1, 0.9)  # 45x the fastest
        watch.observe(1, 2.0)
    assert len(caplog.records) == 1
    assert "45x the fastest" in caplog.records[0].getMessage()
    assert "--threads" in caplog.records[0].getMessage()
