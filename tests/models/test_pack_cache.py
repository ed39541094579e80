"""The packed-weights cache: a GGUF file's second load maps the first load's packed tensors instead of
repacking them, and computes exactly what the first did; stale, damaged or unwritable entries fall
back to packing from the file."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from speclm.models import builder
from speclm.models.gguf_loader import LazyTensors
from speclm.models.gguf_weights import native_kernels
from speclm.models.loader import default_model_path, load_checkpoint
from speclm.models.pack_cache import PackCache

pytestmark = pytest.mark.skipif(native_kernels() is None, reason="GGUF-native kernels need AVX-512 VNNI or AVX2")


def build(**kwargs):
    return builder.build_model(load_checkpoint(None), weights="auto", **kwargs)


def packed(model) -> dict[str, torch.Tensor]:
    return {name: t for name, t in model.named_buffers() if "packed" in name}


def logits(model) -> torch.Tensor:
    from speclm.models.attention import AttentionMetadata

    ids = torch.tensor([1, 422, 3041, 314, 253, 1115])
    cache = model.new_cache(len(ids))
    model(ids[:1], torch.arange(1), cache, AttentionMetadata(0, 1))
    return model.compute_logits(model(ids[1:], torch.arange(1, len(ids)), cache, AttentionMetadata(1, len(ids) - 1)))


def test_a_second_load_maps_the_first_loads_packed_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLM_PACK_CACHE", str(tmp_path))
    first = build()
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert len(entries) == 2 and entries[0].endswith(".json") and entries[1].endswith(".pack"), entries

    def no_reading(*args, **kwargs):
        raise AssertionError("a mapped load read a tensor's bytes from the file")

    monkeypatch.setattr(LazyTensors, "raw", no_reading)
    second = build()
    a, b = packed(first), packed(second)
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # both models' weights are the entry's pages (the page cache): the first packed into them, the
    # second maps them (a mapping of its own), and neither holds a copy
    entry = str(next(tmp_path.glob("*.pack")))
    with open("/proc/self/maps") as f:
        mapped = [line.split()[0].split("-") for line in f if line.rstrip().endswith(entry)]
    ranges = [(int(lo, 16), int(hi, 16)) for lo, hi in mapped]
    for name in a:
        assert a[name].data_ptr() != b[name].data_ptr(), name
        assert all(any(lo <= t.data_ptr() < hi for lo, hi in ranges) for t in (a[name], b[name])), name
    assert torch.equal(logits(first), logits(second))


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLM_PACK_CACHE", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    build()
    assert list(tmp_path.rglob("*.pack")) == []


def test_a_stale_entry_is_rebuilt(tmp_path, monkeypatch):
    """An entry whose recorded takes do not match the load (as if the loader changed without the key
    noticing) is discarded with a warning, and the model packed from the file computes as before."""
    monkeypatch.setenv("SPECLM_PACK_CACHE", str(tmp_path))
    reference = logits(build())
    index = next(tmp_path.glob("*.json"))
    data = json.loads(index.read_text())
    data["takes"][3][2] += 64
    index.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="stale"):
        model = build()
    assert torch.equal(logits(model), reference)
    assert json.loads(index.read_text())["takes"][3][2] == data["takes"][3][2] - 64  # written afresh


def test_a_truncated_entry_is_not_mapped(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLM_PACK_CACHE", str(tmp_path))
    reference = logits(build())
    pack = next(tmp_path.glob("*.pack"))
    with open(pack, "r+b") as f:
        f.truncate(pack.stat().st_size // 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no warning: an unusable entry is simply rebuilt)
        assert torch.equal(logits(build()), reference)
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["bytes"] == pack.stat().st_size


def test_entries_are_per_form_and_a_changed_file_replaces_its_entry(tmp_path, monkeypatch):
    """The same file as a target (its own types) and as a draft (Q4_0) has two entries; a newer file
    at the same path gets a new key, and its older entry is removed; a deleted file's entries go too."""
    monkeypatch.setenv("SPECLM_PACK_CACHE", str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(open(default_model_path(), "rb").read())
    for form in ("auto", "q4_0"):
        builder.build_model(load_checkpoint(str(gguf)), weights=form)
    assert len(list(tmp_path.glob("*.pack"))) == 2
    key = PackCache.for_file(str(gguf), False).key
    gguf.touch()  # a new modification time: as good as a new file
    assert PackCache.for_file(str(gguf), False).key != key
    builder.build_model(load_checkpoint(str(gguf)), weights="auto")
    assert len(list(tmp_path.glob("*.pack"))) == 2
    assert {json.loads(p.read_text())["form"] for p in tmp_path.glob("*.json")} == {"auto", "q4_0"}
    gguf.unlink()  # the file is gone: the next entry written removes its entries
    build()
    assert [json.loads(p.read_text())["source"] for p in tmp_path.glob("*.json")] == [
        os.path.realpath(default_model_path())
    ]


def test_an_unwritable_cache_costs_a_warning_only(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECLM_PACK_CACHE", str(blocker / "packed"))  # under a file: cannot be made
    with pytest.warns(UserWarning, match="could not keep the packed weights"):
        model = build()
    assert torch.isfinite(logits(model)).all()


def test_a_disk_that_fills_up_mid_load_costs_a_warning_only(tmp_path, monkeypatch):
    """Blocks are reserved before each tensor is packed into the entry's file; when that fails (no room),
    the rest of the model goes to anonymous memory, the model is whole, and no entry is left behind."""
    from speclm.models.pack_cache import PackWriter

    monkeypatch.setenv("SPECLM_PACK_CACHE", "off")
    reference = logits(build())
    monkeypatch.setenv("SPECLM_PACK_CACHE", str(tmp_path))
    reserve, calls = PackWriter.reserve, []

    def fills_up(self, buffer, offset, nbytes):
        calls.append(nbytes)
        if len(calls) > 20:
            self.failed = OSError(28, "No space left on device")
            return False
        return reserve(self, buffer, offset, nbytes)

    monkeypatch.setattr(PackWriter, "reserve", fills_up)
    with pytest.warns(UserWarning, match="No space left"):
        model = build()
    assert len(calls) == 21  # (not asked again: anonymous memory from the failure on)
    assert torch.equal(logits(model), reference)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_loads_unfinished_entry_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLM_PACK_CACHE", str(tmp_path))
    gone = _a_finished_pid()
    unfinished = tmp_path / f"model-0123456789abcdef.pack.{gone}.tmp"
    unfinished.write_bytes(b"x" * 4096)
    build()
    assert not unfinished.exists()
    assert len(list(tmp_path.glob("*.pack"))) == 1


def _a_finished_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
