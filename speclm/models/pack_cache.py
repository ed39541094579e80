"""A GGUF model's repacked weights kept on disk, so that the next load maps them instead of repacking.

Repacking a GGUF file for the kernels (speclm/models/gguf_weights.py) writes the model's whole size
into fresh memory, and faulting that in is most of a load's time (on a virtual machine it can take
longer than everything else together). llama.cpp maps its file from the page cache instead. So the
first load of a file packs its tensors straight into a cache entry's file (its PackArena's buffers are
regions of the file, mapped shared: no copy), and later loads map that entry read-only (`map_file`):
the pages come from the page cache, on 2 MB pages where the filesystem keeps large folios (as ext4 and
xfs do), and no tensor is read or repacked. The resident memory is the same: the weights, once.

An entry is keyed by everything its bytes depend on: the file (path, size, modification time, inode),
the weight format (a draft's Q4_0), the head's rows (a draft's token map) and the packing code. It
also records the arena's takes, which a load replays and checks. A stale or unreadable entry is
rebuilt. Entries live in $SPECLM_PACK_CACHE (default ~/.cache/speclm/packed); `off` turns the cache
off. Only the newest entry of a file in each form is kept, and entries of deleted files are removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import torch

from speclm.kernels import PACKING_SOURCES
from speclm.models.gguf_weights import PackArena, native_kernels

ENTRY_VERSION = 2  # bump when the entry's layout changes (the packing code's own changes are in the key)
FILE_ALIGN = 2 << 20  # each arena buffer starts on a 2 MB boundary of the file, so it can map on huge pages


def cache_dir() -> Path | None:
    """Where entries live; None when the cache is turned off."""
    setting = os.environ.get("SPECLM_PACK_CACHE", "")
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    if setting:
        return Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "speclm" / "packed"


def _packing_code_digest() -> str:
    """The repacking code's hash: a changed layout must not map an old entry."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in PACKING_SOURCES)).hexdigest()


class MappedArena:
    """A PackArena whose views come from a cache entry, already packed: `take` replays the takes that
    built the entry (the same sizes, in the same order) and the loader fills nothing."""

    filled = True

    def __init__(self, data: torch.Tensor, takes: list[list[int]], buffer_offsets: list[int]) -> None:
        self.data, self.takes, self.offsets = data, takes, buffer_offsets
        self.next = 0

    def take(self, nbytes: int) -> torch.Tensor:
        if self.next >= len(self.takes) or self.takes[self.next][2] != nbytes:
            raise StaleEntry(f"take {self.next} of {nbytes} bytes is not the entry's")
        buffer, offset, _ = self.takes[self.next]
        self.next += 1
        start = self.offsets[buffer] + offset
        return self.data[start : start + nbytes]

    def check_complete(self) -> None:
        if self.next != len(self.takes):
            raise StaleEntry(f"the load took {self.next} of the entry's {len(self.takes)} tensors")


class StaleEntry(Exception):
    """A cache entry that does not match the load replaying it (rebuilt)."""


class PackWriter:  # a gguf_weights.BufferFile
    """A cache entry being written: the PackArena's buffers are regions of its file, mapped shared, so that
    packing writes straight into the page cache (no copy, no second helping of fresh memory). Blocks are
    reserved before each tensor is written: a full disk then fails here, cleanly, instead of as a SIGBUS
    when a page is first written. After a failure the arena goes on in anonymous memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "w+b")  # noqa: SIM115 (closed in close())
        self.offsets: list[int] = []  # file offset of each buffer
        self.size = 0
        self.failed: OSError | RuntimeError | None = None

    def buffer(self, nbytes: int) -> torch.Tensor | None:
        """A new buffer of `nbytes` at the file's end (2 MB-aligned), or None after a failure."""
        if self.failed:
            return None
        offset = -(-self.size // FILE_ALIGN) * FILE_ALIGN
        try:
            os.ftruncate(self.file.fileno(), offset + nbytes)  # (sparse: blocks come with reserve())
            mapped = native_kernels().map_file(str(self.path), offset, nbytes, True)
        except (OSError, RuntimeError) as e:
            self.failed = e
            return None
        self.offsets.append(offset)
        self.size = offset + nbytes
        return mapped

    def reserve(self, buffer: int, offset: int, nbytes: int) -> bool:
        """Reserve the blocks of a take; False (and failed) when the disk has no room."""
        if self.failed:
            return False
        try:
            os.posix_fallocate(self.file.fileno(), self.offsets[buffer] + offset, nbytes)
        except OSError as e:
            self.failed = e
            return False
        return True

    def close(self, size: int | None = None) -> None:
        if size is not None:
            self.file.truncate(size)
        self.file.close()


class PackCache:
    """The cache entry of one GGUF file in one packed form."""

    def __init__(self, directory: Path, source: str, form: str, key: str) -> None:
        self.directory, self.source, self.form, self.key = directory, source, form, key
        stem = Path(source).name.removesuffix(".gguf")
        self.pack = directory / f"{stem}-{key[:16]}.pack"
        self.index = self.pack.with_suffix(".json")

    @classmethod
    def for_file(cls, path: str, to_q4_0: bool) -> PackCache | None:
        """The entry for a GGUF file loaded in this form, or None when the cache is off."""
        directory = cache_dir()
        if directory is None:
            return None
        source = os.path.realpath(path)
        st = os.stat(source)
        parts = [
            f"v{ENTRY_VERSION}",
            source,
            str(st.st_size),
            str(st.st_mtime_ns),
            str(st.st_ino),
            f"q4_0={to_q4_0}",
            f"buffers={PackArena.BUFFER_BYTES},{PackArena.ALIGN}",
            _packing_code_digest(),
        ]
        form = "q4_0" if to_q4_0 else "auto"
        return cls(directory, source, form, hashlib.sha256("\n".join(parts).encode()).hexdigest())

    def open(self) -> MappedArena | None:
        """The entry's arena, mapped, or None when there is no usable entry."""
        try:
            index = json.loads(self.index.read_text())
            if index.get("key") != self.key or self.pack.stat().st_size != index["bytes"]:
                return None
            data = native_kernels().map_file(str(self.pack), 0, index["bytes"], False)
        except (OSError, ValueError, KeyError, RuntimeError):
            return None
        return MappedArena(data, index["takes"], index["buffer_offsets"])

    def writer(self) -> PackWriter | None:
        """A writer for this entry (in a file of its own until finished), or None (with a warning) when the
        folder cannot be written: that only costs the next load its speed-up."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_abandoned_writes()
            return PackWriter(self.pack.with_name(f"{self.pack.name}.{os.getpid()}.tmp"))
        except OSError as e:
            self._warn(e)
            return None

    def finish(self, arena: PackArena) -> None:
        """Make the arena's written buffers read-only and the entry visible to later loads."""
        writer = arena.writer
        if writer.failed or not arena.buffers:  # (a file of float tensors only has nothing packed to keep)
            if writer.failed:
                self._warn(writer.failed)
            self.abandon(writer)
            return
        kernels, used = native_kernels(), arena.buffer_used()
        for buffer in arena.buffers:
            kernels.seal_mapping(buffer)  # (a stray write into the weights would corrupt every later load)
        size = writer.offsets[-1] + used[-1]
        try:
            writer.close(size)
            os.replace(writer.path, self.pack)
            index = {
                "key": self.key,
                "source": self.source,
                "form": self.form,
                "bytes": size,
                "buffer_offsets": writer.offsets,
                "takes": [list(t) for t in arena.takes],
            }
            tmp_index = self.index.with_name(f"{self.index.name}.{os.getpid()}.tmp")
            tmp_index.write_text(json.dumps(index))
            os.replace(tmp_index, self.index)
            self._remove_older_entries()
        except OSError as e:
            self._warn(e)
            self.abandon(writer)

    def _warn(self, error: Exception) -> None:
        warnings.warn(f"speclm: could not keep the packed weights in {self.directory} ({error})", stacklevel=5)

    def abandon(self, writer: PackWriter) -> None:
        """Drop an unfinished entry (a failed write, a load that raised)."""
        if not writer.file.closed:
            writer.close()
        writer.path.unlink(missing_ok=True)

    def discard(self) -> None:
        for path in (self.index, self.pack):
            path.unlink(missing_ok=True)

    def _remove_abandoned_writes(self) -> None:
        """Unfinished entries of processes that are gone (killed while loading)."""
        for tmp in self.directory.glob("*.tmp"):
            try:
                os.kill(int(tmp.suffixes[-2].lstrip(".")), 0)
            except ProcessLookupError:
                tmp.unlink(missing_ok=True)
            except (ValueError, IndexError, PermissionError):
                continue

    def _remove_older_entries(self) -> None:
        """Entries of the same file in the same form under other keys (an older file, older packing code,
        another token map), and entries of files that are gone."""
        for other in self.directory.glob("*.json"):
            if other == self.index:
                continue
            try:
                index = json.loads(other.read_text())
                same = index.get("source") == self.source and index.get("form") == self.form
                if same or not os.path.exists(index.get("source", "")):
                    other.unlink(missing_ok=True)
                    other.with_suffix(".pack").unlink(missing_ok=True)
            except (OSError, ValueError):
                continue
