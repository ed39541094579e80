#!/usr/bin/env bash
# The GPU checks of issue 32 in one prepared run, from the repository root, results under $OUT:
#   bash benchmarks/cuda/run_gpu.sh [all|tests|bench|gemm|splitk|probe]
# Hard limits per step (all: at most 500 s, inside one 540 s call): wheels 40 s, machine 30 s, tests 230 s,
# benchmark 200 s; gemm (cuBLAS against a Triton GEMM, not part of all) 90 s; splitk (split-K against the
# single-pass attention kernel, not part of all) 200 s. Each step is isolated: it has its own hard timeout, writes its own log, and a failure
# does not stop the next step. What speclm imports and the GPU image lacks (gguf; fastapi, pydantic, uvicorn
# and their dependencies for the server test) comes as wheels from .whl/ (carried; see
# benchmarks/cuda/README.md). The default 135M model travels in parts (.m135/smollm135m.gguf.partNN, one call
# each: the tree and what it carries must stay under 64 MiB a call) and is joined here when all are.
set -u
WHAT=${1:-all}
OUT=${OUT:-/tmp/speclm_gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_gpu.log") 2>&1
PY=${PYTHON:-python3}
export SPECLM_CPU_KERNELS=0 # no C++ build there: the CPU reference runs of the tests use torch's ops
export SPECLM_PACK_CACHE=off
export PYTHONPATH=/tmp/site:$PWD
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

step "setup"
if ls .whl/*.whl >/dev/null 2>&1; then
  # By name, without dependencies: pip picks each package's wheel for this Python (pydantic_core is compiled).
  NAMES=$(ls .whl/*.whl | xargs -n1 basename | sed 's/-.*//' | sort -u)
  timeout 40 $PY -m pip install -q --no-index --find-links .whl --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $NAMES || echo "wheel install failed"
  echo "wheels installed: $(echo $NAMES | wc -w) packages"
fi
PARTS=$(ls .m135/smollm135m.gguf.part* 2>/dev/null | sort)
if [ -n "$PARTS" ]; then
  cat $PARTS > /tmp/smollm135m.gguf
  if [ "$(sha256sum /tmp/smollm135m.gguf | cut -c1-64)" = "$(cat .m135/sha256 2>/dev/null)" ]; then
    export SPECLM_BENCH_135M=/tmp/smollm135m.gguf
    echo "135M model joined from $(echo $PARTS | wc -w) parts: $SPECLM_BENCH_135M"
  else
    echo "135M parts present ($(echo $PARTS | wc -w)) but the joined file's checksum differs: not used"
  fi
else
  echo "no 135M model parts: its benchmark part is skipped"
fi

step "machine"
nvidia-smi || echo "no nvidia-smi"
timeout 30 $PY - <<'EOF' || echo "version probe failed"
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported())
for name in ("triton", "transformers", "tokenizers", "safetensors", "numpy", "gguf", "tqdm", "pytest", "jinja2", "yaml",
             "llguidance", "fastapi", "pydantic", "uvicorn", "prometheus_client"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except ImportError as e:
        print(name, "MISSING", e)
import speclm  # noqa: F401  (the package imports with what is here)
print("import speclm: ok")
EOF

if [ "$WHAT" = gemm ]; then
  # cuBLAS against a Triton GEMM written for decoding (benchmarks/cuda/triton_gemm.py: not speclm's path) on the
  # 1.5B's projections, with a sweep of its plans
  step "GEMM benchmark"
  timeout -k 10 ${GEMM_TIMEOUT:-90} $PY benchmarks/cuda/bench_gemm.py --out "$OUT"
  echo "gemm bench exit $?"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  step "pytest -m cuda"
  # (pytest-timeout is in the GPU image: one hung test fails alone.) Each test's result is printed as it ends.
  # Files in order of what matters most should time run out: kernels, speculative == plain, graphs == eager,
  # greedy against the CPU, sliding windows, the server, the G-test (the slowest) last.
  # CUDA_TESTS="server exactness" runs those files alone (a rerun of what a timed-out run did not reach).
  FILES=""
  for f in ${CUDA_TESTS:-attention speculative graphs greedy sliding_window server exactness}; do
    FILES="$FILES tests/cuda/test_cuda_$f.py"
  done
  if [ -z "${CUDA_TESTS:-}" ]; then  # (any others)
    for f in tests/cuda/test_*.py; do case "$FILES " in *" $f "*) ;; *) FILES="$FILES $f" ;; esac; done
  fi
  timeout -k 10 ${TEST_TIMEOUT:-230} $PY -m pytest -m cuda $FILES \
    -v -rA -p no:cacheprovider --durations=15 \
    $($PY -c "import pytest_timeout" 2>/dev/null && echo --timeout=90) \
    --junitxml="$OUT/junit_cuda.xml" 2>&1 | tee "$OUT/pytest_cuda.log" | grep --line-buffered -E " (PASSED|FAILED|ERROR|SKIPPED)"
  echo "pytest exit ${PIPESTATUS[0]}"
  tail -n 40 "$OUT/pytest_cuda.log"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  step "benchmark"
  timeout -k 10 ${BENCH_TIMEOUT:-200} $PY benchmarks/cuda/bench_cuda.py --out "$OUT"
  echo "bench exit $?"
  cat "$OUT/cuda_bench.md" 2>/dev/null
fi
if [ "$WHAT" = probe ]; then
  # Where a batch-1 step of the 1.5B shapes goes (bf16): split-K's tests, then split-K against the single
  # pass, the projections' GEMMs alone, and the profiler's view of a step with either attention kernel.
  step "split-K tests"
  timeout -k 10 90 $PY -m pytest -m cuda tests/cuda/test_cuda_attention.py -q -p no:cacheprovider 2>&1 | tail -n 15
  step "split-K benchmark"
  timeout -k 10 200 $PY benchmarks/cuda/bench_splitk.py --out "$OUT"
  step "GEMM benchmark"
  timeout -k 10 90 $PY benchmarks/cuda/bench_gemm.py --out "$OUT"
  for partition in 0 64; do
    step "profile, partition $partition"
    timeout -k 10 70 $PY benchmarks/cuda/profile_step.py --partition $partition --out "$OUT" | head -n 32
  done
fi
if [ "$WHAT" = splitk ]; then
  step "split-K benchmark"
  timeout -k 10 ${SPLITK_TIMEOUT:-200} $PY benchmarks/cuda/bench_splitk.py --out "$OUT"
  echo "splitk bench exit $?"
fi
step "done"
