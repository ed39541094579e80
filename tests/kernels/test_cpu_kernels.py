"""speclm's compiled CPU kernels: attention rows equal torch's SDPA to float rounding and do not depend on
the other rows of a call (what exact speculation needs), RMSNorm equals torch's, and without the
kernels (no compiler, or SPECLM_CPU_KERNELS=0) the engine falls back to torch's ops, still exact."""

import pytest
import torch
import torch.nn.functional as F

import speclm.kernels as kernels_module
import speclm.models.attention as attention
from speclm import LLM, SamplingParams
from speclm.kernels import cpu_kernels
from speclm.models.attention import DecodeRows, attend_like_decoding
from speclm.models.layers import rms_norm
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

kernels = cpu_kernels()
needs_kernels = pytest.mark.skipif(kernels is None, reason="no C++ compiler: the kernels did not build")
EMPTY = torch.empty(0, dtype=torch.long)


def sdpa_row(q, keys, values, index):  # [heads, 1, d]: one query over keys[:, index], torch's reference
    return F.scaled_dot_product_attention(q[None], keys[None, :, index], values[None, :, index], enable_gqa=True)[0]


@needs_kernels
@pytest.mark.parametrize("head_dim", [32, 64, 128, 48])  # 32/64/128: the compiled forms; 48: the generic loop
def test_attend_rows_matches_sdpa_for_causal_and_slot_rows(head_dim):
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, slots = 6, 2, 300
    keys, values = (
        torch.randn(kv_heads, slots, head_dim, generator=g),
        torch.randn(kv_heads, slots, head_dim, generator=g),
    )
    q = torch.randn(heads, 5, head_dim, generator=g)
    causal = DecodeRows.causal(200, 5)  # rows over keys 0..195 .. 0..199
    out = kernels.attend_rows(q, keys, values, causal.lengths, EMPTY, EMPTY, head_dim**-0.5)
    for i, length in enumerate(causal.lengths.tolist()):
        torch.testing.assert_close(
            out[:, i : i + 1], sdpa_row(q[:, i : i + 1], keys, values, slice(0, length)), rtol=0, atol=2e-6
        )
    table = torch.randperm(slots, generator=g)[:250].repeat(5, 1)  # each row: its own scattered slots
    lengths = torch.tensor([250, 1, 17, 130, 64])
    out = kernels.attend_rows(q, keys, values, lengths, table, EMPTY, head_dim**-0.5)
    for i, length in enumerate(lengths.tolist()):
        torch.testing.assert_close(
            out[:, i : i + 1], sdpa_row(q[:, i : i + 1], keys, values, table[i, :length]), rtol=0, atol=2e-6
        )


@needs_kernels
def test_attend_rows_is_row_invariant_bit_for_bit():
    """A row's result must not depend on the rows beside it, their lengths, its slot layout (a paged
    pool or a contiguous cache) or the thread count: that is what makes verification rows and batched
    decode rows equal plain decoding."""
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, d = 9, 3, 64
    pool_k, pool_v = torch.randn(kv_heads, 900, d, generator=g), torch.randn(kv_heads, 900, d, generator=g)
    lengths = torch.tensor([37, 300, 1, 129, 250, 64, 17])
    table = torch.stack([torch.randperm(900, generator=g)[:300] for _ in lengths])
    q = torch.randn(heads, len(lengths), d, generator=g)
    before = torch.get_num_threads()
    try:
        together = kernels.attend_rows(q, pool_k, pool_v, lengths, table, EMPTY, 0.125)
        torch.set_num_threads(1)
        assert torch.equal(kernels.attend_rows(q, pool_k, pool_v, lengths, table, EMPTY, 0.125), together)
    finally:
        torch.set_num_threads(before)
    for i, length in enumerate(lengths.tolist()):
        alone = kernels.attend_rows(
            q[:, i : i + 1].clone(), pool_k, pool_v, lengths[i : i + 1], table[i : i + 1], EMPTY, 0.125
        )
        index = table[i, :length]
        contiguous = kernels.attend_rows(
            q[:, i : i + 1].clone(),
            pool_k[:, index].contiguous(),
            pool_v[:, index].contiguous(),
            lengths[i : i + 1],
            EMPTY,
            EMPTY,
            0.125,
        )
        assert torch.equal(alone, together[:, i : i + 1]) and torch.equal(contiguous, alone), i


@needs_kernels
def test_a_row_does_not_see_the_scores_an_earlier_row_left_behind():
    """A thread's score buffer holds the previous row's leftovers past that row's length. A short row whose
    scores are all far below zero leaves overflowed values (inf) there; the next row (16 keys or more, its
    largest score among those slots) must still find its true maximum. It once seeded its maximum from
    those leftovers (NaN lanes), shifted the softmax by the wrong value and overflowed: the real 1.5B's
    greedy output then depended on how its prompt was chunked, and speculation left plain decoding."""
    d = 64
    keys = torch.zeros(1, 32, d)
    keys[0, :, 0] = torch.tensor([1.0] * 3 + [2.0] * 13 + [1.0] * 16)
    values = torch.randn(1, 32, d, generator=torch.Generator().manual_seed(0))
    q = torch.zeros(1, 2, d)
    q[0, 0, 0] = -88.72  # row 0: 3 keys scoring -88.72: its buffer's other lanes, 0, become exp(88.72) = inf
    q[0, 1, 0] = 100.0  # row 1: 20 keys, the largest scores at keys 3..15
    lengths = torch.tensor([3, 20])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # both rows on one thread, in order
        together = kernels.attend_rows(q, keys, values, lengths, EMPTY, EMPTY, 1.0)
    finally:
        torch.set_num_threads(before)
    alone = kernels.attend_rows(q[:, 1:].clone(), keys, values, lengths[1:], EMPTY, EMPTY, 1.0)
    assert torch.isfinite(together).all()
    assert torch.equal(together[:, 1:], alone)
    assert torch.allclose(alone[0, 0], values[0, 3:16].mean(0), atol=1e-5)


@needs_kernels
def test_rows_sharing_a_slot_table_row_equal_rows_with_their_own():
    """A prompt chunk's rows read one shared list of slots (slot_rows): bit for bit what each row
    computes with its own copy of the list, and what it computes alone."""
    g = torch.Generator().manual_seed(4)
    pool_k, pool_v = torch.randn(3, 500, 64, generator=g), torch.randn(3, 500, 64, generator=g)
    slots = torch.randperm(500, generator=g)[:200]
    lengths = torch.arange(150, 200)  # a causal chunk of 50 rows
    q = torch.randn(9, 50, 64, generator=g)
    shared = kernels.attend_rows(q, pool_k, pool_v, lengths, slots[None], torch.zeros(50, dtype=torch.long), 0.125)
    own = kernels.attend_rows(q, pool_k, pool_v, lengths, slots.repeat(50, 1), EMPTY, 0.125)
    assert torch.equal(shared, own)
    for i in (0, 17, 49):
        alone = kernels.attend_rows(
            q[:, i : i + 1].clone(), pool_k, pool_v, lengths[i : i + 1], slots[None], EMPTY, 0.125
        )
        assert torch.equal(alone, shared[:, i : i + 1])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_kernel_matches_torch(dtype):
    g = torch.Generator().manual_seed(2)
    x, weight = torch.randn(5, 576, generator=g) * 3, torch.randn(576, generator=g).to(dtype)
    out = kernels.rms_norm(x, weight, 1e-5)
    reference = weight * torch.rms_norm(x, (576,), eps=1e-5).to(dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(
        out.float(), reference.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-5
    )
    with torch.enable_grad():  # gradients wanted: torch's ops run, so training still differentiates
        w = weight.float().requires_grad_()
        rms_norm(x, w, 1e-5).sum().backward()
    assert w.grad is not None


def test_attention_without_kernels_matches_the_kernel_path(monkeypatch):
    g = torch.Generator().manual_seed(3)
    keys, values, q = (
        torch.randn(2, 50, 64, generator=g),
        torch.randn(2, 50, 64, generator=g),
        torch.randn(4, 3, 64, generator=g),
    )
    rows = DecodeRows.tree(40, [[0], [0, 1], [0, 2]])
    with_kernels = attend_like_decoding(q, keys, values, rows)
    monkeypatch.setattr(attention, "cpu_kernels", lambda: None)
    without = attend_like_decoding(q, keys, values, rows)
    torch.testing.assert_close(without, with_kernels, rtol=0, atol=2e-6)
    for i, path in enumerate([[0], [0, 1], [0, 2]]):  # row i: slots 0..39, then its path's slots 40 + path
        index = torch.cat([torch.arange(40), 40 + torch.tensor(path)])
        assert torch.equal(without[:, i : i + 1], sdpa_row(q[:, i : i + 1], keys, values, index))


@pytest.mark.usefixtures("one_thread")
def test_speculation_stays_exact_on_torch_ops_without_the_kernels(monkeypatch):
    """The fallback path (per-row SDPA calls) keeps speculative greedy == plain greedy in bf16."""
    monkeypatch.setattr(attention, "cpu_kernels", lambda: None)
    plain_llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, weights="bf16")
    spec_llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, weights="bf16", spec="layerskip:3", adaptive=False)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for prompt in ["Once upon a time", "Tom and Lily went to the park. Tom"]:
        out = spec_llm.generate(prompt, params)[0]
        assert out.token_ids == plain_llm.generate(prompt, params)[0].token_ids
        assert out.stats.target_forwards < len(out.token_ids)  # drafts were accepted


def test_loader_is_off_with_the_environment_switch_and_warns_when_the_build_fails(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(kernels_module.DISABLE_ENV, "0")
    kernels_module.cpu_kernels.cache_clear()
    try:
        assert kernels_module.cpu_kernels() is None
        monkeypatch.delenv(kernels_module.DISABLE_ENV)
        broken = tmp_path / "cpu_kernels.cpp"
        broken.write_text("#error this source does not compile\n")
        monkeypatch.setattr(kernels_module, "UNITS", [broken])
        monkeypatch.setenv(kernels_module.CACHE_ENV, str(tmp_path / "builds"))
        kernels_module.cpu_kernels.cache_clear()
        assert kernels_module.cpu_kernels() is None
        err = capsys.readouterr().err
        assert "speclm: warning: CPU kernels unavailable" in err and "torch's ops" in err
    finally:
        kernels_module.cpu_kernels.cache_clear()  # the next caller gets the real build again


int4_kernels = None if kernels is None or not kernels.int4_available() else kernels
needs_int4 = pytest.mark.skipif(int4_kernels is None, reason="the kernels' int4 matmul needs AVX-512 BF16 or AVX2")


def test_int4_packing_round_trips():
    from speclm.models.quant_linear import pack_int4, unpack_int4

    q = torch.randint(0, 16, (48, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    packed = pack_int4(q)
    assert packed.shape == (3, 8, 64) and torch.equal(unpack_int4(packed), q)
    assert packed[0, 0, 2 * 5 + 1] == q[5, 1] | (q[5, 3] << 4)  # byte 2l+e: q[l, e] low, q[l, 2+e] high
    assert packed[0, 0, 32 + 2 * 5] == q[5, 4] | (q[5, 6] << 4)  # byte 32+2l+e: q[l, 4+e], q[l, 6+e]


@needs_int4
@pytest.mark.parametrize("group_size", [32, 128])
def test_int4_kernel_matches_torch_on_the_same_grid_and_is_row_invariant(group_size):
    from speclm.models.quant_linear import Int4Linear, quantize_int4

    g = torch.Generator().manual_seed(5)
    weight = torch.randn(96, 256, generator=g) * 0.05
    layer = Int4Linear(weight, group_size=group_size)
    assert layer.layout == "speclm"
    q, _, _ = quantize_int4(weight, group_size)
    torch_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    x = torch.randn(17, 256, generator=g).bfloat16()
    ours = int4_kernels.int4_matmul(x, layer.weight, group_size, layer.scales_and_zeros)
    scale, zero = layer.group_scales_and_zeros()
    torch_pairs = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().bfloat16()  # [in/group, out, 2]
    theirs = torch.ops.aten._weight_int4pack_mm_for_cpu(x, torch_packed, group_size, torch_pairs)
    # both accumulate exact bf16 products in fp32 (in another order) and round to bf16: within one ulp
    assert ((ours.float() - theirs.float()).abs() <= theirs.float().abs() * 2**-7 + 1e-6).all()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(int4_kernels.int4_matmul(x, layer.weight, group_size, layer.scales_and_zeros), ours)
    finally:
        torch.set_num_threads(before)
    for rows in (range(0, 1), range(3, 8), range(8, 17)):  # tiles of 1, 5 and 9 rows: each row as alone
        part = int4_kernels.int4_matmul(
            x[rows.start : rows.stop].clone(), layer.weight, group_size, layer.scales_and_zeros
        )
        assert torch.equal(part, ours[rows.start : rows.stop])
    for r in range(17):
        assert torch.equal(
            int4_kernels.int4_matmul(x[r : r + 1].clone(), layer.weight, group_size, layer.scales_and_zeros),
            ours[r : r + 1],
        )


def test_int4_layers_fall_back_to_torchs_kernel(monkeypatch):
    import speclm.models.quant_linear as quant_linear

    monkeypatch.setattr(quant_linear, "int4_kernels", lambda device: None)
    g = torch.Generator().manual_seed(6)
    weight = torch.randn(64, 128, generator=g) * 0.05
    layer = quant_linear.Int4Linear(weight)
    assert layer.layout == "torch"
    x = torch.randn(3, 128, generator=g)
    reference = F.linear(x.bfloat16().float(), layer.dequantized_weight())
    assert ((layer(x) - reference).abs() <= reference.abs() * 2**-8 + 1e-5).all()
    assert ((layer.dequantized_weight() - weight).abs() <= 0.05).all()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_qkv_rotates_like_apply_rope_and_writes_the_cache_slots(dtype):
    from speclm.models.rope import apply_rope

    g = torch.Generator().manual_seed(7)
    n, heads, kv_heads, d = 3, 4, 2, 64
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    angles = torch.rand(n, d // 2, generator=g) * 6
    cos = torch.cat([angles.cos(), angles.cos()], -1)
    signed_sin = torch.cat([-angles.sin(), angles.sin()], -1)
    k_cache, v_cache = torch.zeros(kv_heads, 10, d), torch.zeros(kv_heads, 10, d)
    slots = torch.tensor([7, 2, 5])
    q = kernels.rope_qkv(qkv, cos, signed_sin, heads, kv_heads, k_cache, v_cache, slots)
    parts = qkv.float().view(n, heads + 2 * kv_heads, d).transpose(0, 1)
    rotated = apply_rope(parts[: heads + kv_heads], cos, signed_sin)
    torch.testing.assert_close(q, rotated[:heads], rtol=0, atol=1e-6)
    torch.testing.assert_close(k_cache[:, slots], rotated[heads:], rtol=0, atol=1e-6)
    assert torch.equal(v_cache[:, slots], parts[heads + kv_heads :])
    untouched = torch.ones(10, dtype=torch.bool)
    untouched[slots] = False
    assert not k_cache[:, untouched].any() and not v_cache[:, untouched].any()
    with pytest.raises(RuntimeError, match="slot out of range"):
        kernels.rope_qkv(qkv, cos, signed_sin, heads, kv_heads, k_cache, v_cache, torch.tensor([0, 1, 10]))


@needs_kernels
@pytest.mark.parametrize("width", [1536, 172])  # 172: a tail shorter than a vector (stories260K)
def test_silu_mul_matches_torchs_bf16_ops(width):
    g = torch.Generator().manual_seed(8)
    gate_up = (torch.randn(4, 2 * width, generator=g) * 4).bfloat16()
    gate, up = gate_up.split(width, dim=-1)
    reference = F.silu(gate) * up
    out = kernels.silu_mul(gate_up)
    # silu's exp differs from torch's in the last float bits; after the bf16 roundings: within one bf16 ulp
    assert ((out.float() - reference.float()).abs() <= reference.float().abs() * 2**-7 + 1e-30).all()


@needs_kernels
@pytest.mark.parametrize("width", [4864, 172])
def test_silu_mul_matches_torchs_fp32_ops_to_a_few_ulps(width):
    g = torch.Generator().manual_seed(9)
    gate_up = torch.randn(3, 2 * width, generator=g) * 6
    gate_up[0, :3] = torch.tensor([-200.0, 200.0, 0.0])  # far tails: no overflow
    gate, up = gate_up.split(width, dim=-1)
    reference = (F.silu(gate.double()) * up.double()).float()
    out = kernels.silu_mul(gate_up)
    assert out.dtype == torch.float32 and out.shape == (3, width)
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-30)
    assert out[0, 0].abs() < 1e-30 and out[0, 1] == 200 * up[0, 1] and out[0, 2] == 0
    assert torch.equal(kernels.silu_mul(gate_up[1:2]), out[1:2])  # a row alone (no threads) as in a batch


def test_layers_on_the_kernels_can_be_deep_copied():
    """The layers keep a flag, not the compiled module (which cannot be copied or pickled)."""
    import copy

    from speclm.models.quant_linear import Int4Linear
    from speclm.models.w8a8_linear import W8A8Linear

    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 64, generator=g)
    for layer in (Int4Linear(torch.randn(32, 64, generator=g)), W8A8Linear(torch.randn(32, 64, generator=g))):
        assert torch.equal(copy.deepcopy(layer)(x), layer(x))


@needs_kernels
def test_a_lock_file_left_by_a_killed_build_does_not_hang_the_next_load(tmp_path):
    """torch's build baton is a plain file; a process killed mid-build leaves it behind, and every later
    load used to wait on it forever. Our flock marks it stale: the load removes it and goes on."""
    import shutil
    import subprocess
    import sys

    from speclm.kernels import CACHE_ENV, build_name

    built = kernels_module.Path(kernels.__file__).parent
    shutil.copytree(built, tmp_path / build_name())  # the built extension: loading it needs no compile
    (tmp_path / build_name() / "lock").touch()
    stale = tmp_path / "speclm_cpu_kernels_0123456789abcdef"  # a build last loaded two months ago
    stale.mkdir()
    (stale / kernels_module.LAST_USED).touch()
    kernels_module.os.utime(stale / kernels_module.LAST_USED, (1, 1))
    code = "from speclm.kernels import cpu_kernels; assert cpu_kernels() is not None"
    env = {**kernels_module.os.environ, CACHE_ENV: str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert "removing a kernel-build lock left by a killed process" in run.stderr
    assert not (tmp_path / build_name() / "lock").exists()
    assert (tmp_path / build_name() / kernels_module.LAST_USED).exists() and not stale.exists()


def test_builds_not_loaded_for_a_month_are_removed_and_the_rest_kept(tmp_path):
    """Every source edit, torch version, CPU and checkout leaves a build of a few MB in the cache. A load
    removes the others that no process has loaded for UNUSED_DAYS (a build from before the markers: by
    its folder's age), but never the one it keeps, a recent one, one in use, or what is not a build."""
    import fcntl
    import time

    now, os = time.time(), kernels_module.os

    def build(name: str, days_ago: float, marker: bool = True):
        folder = tmp_path / name
        folder.mkdir()
        (folder / f"{name}.so").write_bytes(b"\0")
        if marker:
            (folder / kernels_module.LAST_USED).touch()
        os.utime(folder / kernels_module.LAST_USED if marker else folder, (now - days_ago * 86400,) * 2)
        return folder

    old, unmarked = build("speclm_cpu_kernels_old", 40), build("speclm_cpu_kernels_unmarked", 40, marker=False)
    recent, kept, busy = (build(f"speclm_cpu_kernels_{n}", d) for n, d in (("recent", 2), ("kept", 400), ("busy", 40)))
    other = tmp_path / "notes"
    other.mkdir()
    os.utime(other, (now - 400 * 86400,) * 2)
    with open(busy / kernels_module.FLOCK, "w") as held:  # another process building or loading it
        fcntl.flock(held, fcntl.LOCK_EX)
        removed = kernels_module.prune_unused_builds(tmp_path, keep=kept.name)
    assert sorted(removed) == [old.name, unmarked.name]
    assert not old.exists() and not unmarked.exists()
    assert all(p.exists() for p in (recent, kept, busy, other))


def test_the_build_name_covers_every_kernel_source():
    """Every C++ file in speclm/kernels/ is compiled (a unit), included by exactly one unit (a source) or
    hashed into the build's name as a header: an edit to any of them makes a new build, never a stale
    cached one, and no source is left out of the module or compiled twice."""
    units, sources, headers = kernels_module.UNITS, kernels_module.SOURCES, kernels_module.HEADERS
    on_disk = {p.name for p in kernels_module.HERE.iterdir() if p.suffix in (".cpp", ".h")}
    assert on_disk == {p.name for p in units + sources + headers}
    assert all(p.suffix == ".cpp" for p in units + sources)
    for source in sources:
        including = [u.name for u in units if f'#include "{source.name}"' in u.read_text()]
        assert len(including) == 1, (source.name, including)
    assert set(kernels_module.PACKING_SOURCES) <= set(sources + headers)


# -march values for the CPU families the kernels have paths for: AVX-512 with BF16 and VNNI; AVX-512 VNNI without
# BF16 (int4 on its AVX2 path beside the AVX-512 GGUF kernel); AVX2 alone.
CPU_FAMILIES = ("sapphirerapids", "icelake-server", "haswell")


@needs_kernels
def test_the_kernels_compile_for_every_cpu_family():
    """A build compiles for its own CPU (-march=native) only, so each other family's paths are compiled here
    (-fsyntax-only): a CI machine of one kind catches what breaks another's build. (Both GGUF micro-kernels
    were defined on AVX-512 CPUs from cf6f826 on; their builds failed while every check ran on AVX2 VMs.)"""
    import concurrent.futures
    import os
    import subprocess

    from torch.utils import cpp_extension

    includes = [arg for path in cpp_extension.include_paths() for arg in ("-isystem", path)]
    compiler = os.environ.get("CXX", "c++")

    def compile_unit(march: str, unit: str) -> tuple[str, str, int, str]:
        command = [compiler, "-std=c++17", "-fsyntax-only", f"-march={march}", "-fopenmp", *includes, unit]
        done = subprocess.run(command, capture_output=True, text=True)
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        return march, os.path.basename(unit), done.returncode, "\n".join(errors[:5])

    units = [str(u) for u in kernels_module.UNITS if u.name != "bindings.cpp"]  # (the bindings have no CPU paths)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: compile_unit(*job), [(m, u) for m in CPU_FAMILIES for u in units]))
    failed = [f"-march={march} {unit}:\n{errors}" for march, unit, code, errors in results if code != 0]
    assert not failed, "\n".join(failed)


@needs_kernels
def test_benchmark_files_name_the_instructions_the_kernels_run():
    """The two AMD EPYC VM kinds share a CPU name (one has AVX-512, one AVX2 only), so a benchmark's machine
    line names the paths the kernels were compiled for, from the build itself: the CPU's own flags decide
    them (-march=native)."""
    from speclm.bench.machine import machine_info

    flags = set(next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split())
    avx2 = {"avx2", "fma"} <= flags
    vnni = {"avx512_vnni", "avx512bw", "avx512f"} <= flags
    gguf = "AVX-512 VNNI" if vnni else "AVX2" if avx2 and "f16c" in flags else ""
    int4 = "AVX-512 BF16" if {"avx512_bf16", "avx512bw"} <= flags else "AVX2" if avx2 else ""
    assert (kernels.gguf_path(), kernels.int4_path()) == (gguf, int4)
    assert kernels.gguf_available() == bool(gguf) and kernels.int4_available() == bool(int4)
    assert f"GGUF {gguf or 'unavailable'}, int4 {int4 or 'unavailable'}" in machine_info()["cpu"]
