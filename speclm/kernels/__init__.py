"""speclm's compiled CPU kernels, one Python module built from the C++ units listed in UNITS (which include
SOURCES) with the system C++ compiler on first use, cached per machine."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

HERE = Path(__file__).parent
# The kernels' sources, each #included by one of UNITS; an edit to any of them or of HEADERS makes a new build.
SOURCES = [
    HERE / name
    for name in (
        "attend_rows.cpp",  # attention rows
        "elementwise.cpp",  # rotary with the cache write, RMSNorm, SiLU
        "int_matmul.cpp",  # int4 and w8a8 matmuls
        "dense_matmul.cpp",  # fp32 and bf16 matmul
        "mapped_memory.cpp",  # huge-page buffers and mapped files
        "gguf_pack.cpp",  # GGUF-native weights: repacking, rows back out
        "gguf_convert.cpp",  # ... re-quantized to Q4_0
        "gguf_activations.cpp",  # ... the activations' int8 quantization
        "gguf_matmul.cpp",  # ... the matmul
        "gguf_decoder.cpp",  # a GGUF-native model's decoder layers
    )
]
# What the compiler is given: the Python module's bindings, and two units that #include SOURCES (parsing
# ATen's headers once per unit, not once per source: unit_rows.cpp says why).
UNITS = [HERE / name for name in ("bindings.cpp", "unit_rows.cpp", "unit_gguf.cpp")]
HEADERS = [
    HERE / name
    for name in (
        "cpu_kernels.h",
        "vector16.h",
        "attend_avx2.h",
        "mapped_memory.h",
        "gguf_format.h",
        "gguf_kernels.h",
        "gguf_activations.h",
        "gguf_microkernel.h",
        "gguf_microkernel_avx2.h",
        "gguf_decoder.h",
    )
]
# What defines the packed weights' bytes: a changed one makes every PackCache entry stale.
PACKING_SOURCES = [HERE / name for name in ("gguf_format.h", "gguf_pack.cpp", "gguf_convert.cpp")]
DISABLE_ENV = "SPECLM_CPU_KERNELS"  # "0": use torch's ops instead (slower; same tokens up to float near-ties)
CACHE_ENV = "SPECLM_KERNEL_CACHE"  # where builds go (default ~/.cache/speclm/kernels)
# Every source edit, torch version, CPU and checkout makes a build of its own (a few MB); one that no
# process has loaded for this long is removed when another build loads.
UNUSED_DAYS = 30
LAST_USED = "last_used"  # a build's marker file, touched on each load
FLOCK = "speclm.flock"  # a build's lock while a process builds, loads or removes it (_build_lock)


def _cpu_signature() -> str:
    """The CPU's model and flags: a build with -march=native must not be reused on another CPU."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown-cpu"
    return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))


def build_name() -> str:
    """Extension name: one per source text, CPU, torch version and source folder. (torch's build files name
    the sources by absolute path: two checkouts sharing one build folder would rebuild it in turn on every
    load, each one's build holding the other's lock.)"""
    text = b"".join(p.read_bytes() for p in UNITS + SOURCES + HEADERS)
    where = str(HERE.resolve()).encode()
    digest = hashlib.sha256(text + where + _cpu_signature().encode() + torch.__version__.encode()).hexdigest()[:16]
    return f"speclm_cpu_kernels_{digest}"


@contextlib.contextmanager
def _build_lock(build_dir: Path):
    """One process at a time loads or builds a given extension. torch guards its build with a plain
    `lock` file that a killed process leaves behind, and every later load then waits on it forever. We
    hold an flock (the OS frees it when its holder dies) around torch's: whoever holds ours knows any
    `lock` file it finds is stale, and removes it."""
    with open(build_dir / FLOCK, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("speclm: waiting for another process's kernel build...", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            print("speclm: removing a kernel-build lock left by a killed process", file=sys.stderr, flush=True)
            stale.unlink(missing_ok=True)
        yield


def prune_unused_builds(cache: Path, keep: str) -> list[str]:
    """Remove the builds in `cache` other than `keep` that were last loaded (or, before markers, built)
    more than UNUSED_DAYS ago, skipping any a process is building or loading now (its flock is held).
    Returns the names removed."""
    cutoff, removed = time.time() - UNUSED_DAYS * 86400, []
    for build in cache.glob("speclm_cpu_kernels_*"):
        marker = build / LAST_USED
        try:
            if build.name == keep or not build.is_dir():
                continue
            if (marker if marker.exists() else build).stat().st_mtime >= cutoff:
                continue
            with open(build / FLOCK, "w") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(build)
        except OSError:  # (BlockingIOError: in use; or gone already, or not ours to remove)
            continue
        removed.append(build.name)
    return removed


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The compiled kernels module, or None when disabled (SPECLM_CPU_KERNELS=0) or when the build
    fails (no compiler): the caller then runs torch's ops, and a one-line warning says so."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    from torch.utils import cpp_extension  # imports setuptools: only when the kernels are wanted

    name = build_name()
    cache = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "speclm" / "kernels")
    build_dir = cache / name
    build_dir.mkdir(parents=True, exist_ok=True)
    if not (build_dir / f"{name}.so").exists():
        print("speclm: compiling the CPU kernels (once per machine: 1-2 minutes)...", file=sys.stderr, flush=True)
    try:
        with _build_lock(build_dir):
            module = cpp_extension.load(
                name=name,
                sources=[str(s) for s in UNITS],
                extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir),
                verbose=False,
            )
    except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(
            f"speclm: warning: CPU kernels unavailable ({first}); using torch's ops (slower decoding and "
            f"verification; set {DISABLE_ENV}=0 to skip the build)",
            file=sys.stderr,
        )
        return None
    with contextlib.suppress(OSError):  # (a read-only cache: nothing to mark or remove)
        (build_dir / LAST_USED).touch()
        prune_unused_builds(cache, keep=name)
    return module
