"""How many CPU threads to compute with when the user does not say.

torch's default is one thread per physical core, and its OpenMP threads wait for each other at the end
of every parallel region. When other processes hold cores, a descheduled thread stalls all the others
and a request can take many times longer than on fewer threads (benchmarks/contention/contention.md; passive
OpenMP waiting helps under load but costs on a quiet machine, so it is not the default). So the default
is the number of cores idle right now, sampled from /proc/stat, at least 1; the runner warns later if
steps become slow anyway.
"""

from __future__ import annotations

import logging
import os
import time

import torch

log = logging.getLogger(__name__)

TORCH_THREADS = torch.get_num_threads()  # torch's own default, before any LLM changed it (process-wide)


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies over all CPUs, or None where /proc/stat does not exist."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return idle, sum(fields[:8])  # user .. steal (guest time is already counted in user)


def idle_cores(sample_seconds: float = 0.05) -> float | None:
    """Cores left idle by every process over a short sample (this process is idle meanwhile)."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(sample_seconds)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return None
    share = (second[0] - first[0]) / (second[1] - first[1])
    return share * (os.cpu_count() or 1)


def default_threads() -> int:
    """torch's thread count, lowered to the idle cores when other processes are busy (at least 1)."""
    cores = TORCH_THREADS
    idle = idle_cores()
    if idle is None or cores == 1:
        return cores
    threads = max(1, min(cores, int(idle + 0.25)))  # a core ~75% idle still counts
    if threads < cores:
        log.warning(
            "speclm: other processes keep about %.1f of %d cores busy; computing with %d thread%s "
            "(--threads N or LLM(threads=N) overrides)",
            (os.cpu_count() or 1) - idle,
            os.cpu_count() or 1,
            threads,
            "" if threads == 1 else "s",
        )
    return threads
