"""A description of the machine a benchmark ran on, stored next to its numbers."""

from __future__ import annotations

import os
import platform


def kernel_paths() -> str:
    """The vector instructions speclm's compiled kernels run here. Two VMs of one CPU name can differ (an AMD
    EPYC with AVX-512 or with AVX2 only), and so do their speeds against peers."""
    from speclm.kernels import cpu_kernels

    kernels = cpu_kernels()
    if kernels is None:
        return "torch's ops, no compiled kernels"
    gguf, int4 = kernels.gguf_path(), kernels.int4_path()
    return f"speclm kernels: GGUF {gguf or 'unavailable'}, int4 {int4 or 'unavailable'}"


def machine_info() -> dict:
    """The CPU (its name and the kernels' instruction set), cores, memory and versions."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "cpu": f"{cpu} ({kernel_paths()})",
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gb": mem_gb,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }
