"""POSIX shared-memory regions for input batches, when the gateway and Triton share a host.

A batch copied into a region travels to Triton as a name instead of 4.8 MB of protobuf (batch 32
at 224 px). Region names carry the owning process id and a random token, so no other process can
guess one to read or spoof a batch, and they are created exclusively (``O_EXCL``): a name that
exists is never reused. Regions are unlinked when their worker stops; a worker killed without
stopping leaves regions behind, and ``orphans`` finds them (by their dead owner) so the worker
that replaces it can unregister and unlink them.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

PREFIX = "clipgw_"
_NAME = re.compile(rf"^{PREFIX}(\d+)_[0-9a-f]{{16}}$")
SHM_DIR = Path("/dev/shm")


@dataclass
class Region:
    name: str
    memory: shared_memory.SharedMemory
    byte_size: int

    def view(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.ndarray(shape, dtype=np.uint8, buffer=self.memory.buf)


class RegionPool:
    """Up to ``capacity`` regions of ``byte_size`` bytes, created on first use and reused.

    ``acquire`` never waits: with every region busy it returns None and the caller sends its
    batch over gRPC instead, so the pool cannot make a request queue.
    """

    def __init__(self, byte_size: int, capacity: int) -> None:
        self.byte_size = byte_size
        self.capacity = capacity
        self._free: list[Region] = []
        self.created: list[Region] = []

    def acquire(self) -> Region | None:
        if self._free:
            return self._free.pop()
        if len(self.created) >= self.capacity:
            return None
        name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(8)}"
        memory = shared_memory.SharedMemory(name=name, create=True, size=self.byte_size)
        region = Region(name, memory, self.byte_size)
        self.created.append(region)
        return region

    def release(self, region: Region) -> None:
        self._free.append(region)

    def disable(self) -> None:
        """No more regions (Triton cannot map ours): every call goes over gRPC."""
        self.capacity = 0
        self._free.clear()

    def close(self) -> None:
        """Unlink every region (the caller unregisters them from Triton first)."""
        for region in self.created:
            region.memory.close()
            with contextlib.suppress(FileNotFoundError):
                region.memory.unlink()
        self.created.clear()
        self._free.clear()


def owner(name: str) -> int | None:
    """The process id in one of our region names, or None for a name that is not ours."""
    found = _NAME.match(name)
    return int(found.group(1)) if found else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def orphans(names: list[str] | None = None) -> list[str]:
    """Our region names (from ``names``, or all of /dev/shm) whose owning process is gone."""
    if names is None:
        names = [p.name for p in SHM_DIR.glob(f"{PREFIX}*")] if SHM_DIR.is_dir() else []
    found = []
    for name in names:
        pid = owner(name)
        if pid is not None and pid != os.getpid() and not alive(pid):
            found.append(name)
    return found


def unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (SHM_DIR / name).unlink()
