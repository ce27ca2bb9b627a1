"""CPU seconds from the kernel's accounting: a process tree's (``/proc``), split into the process
and its descendants, its threads' by role, and this thread's images per CPU-second of some work."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path


def tree(pid: int) -> list[int]:
    """``pid`` and every descendant (``pid`` first)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(entry / "stat")[1])
            except OSError:
                continue  # gone meanwhile
    found, todo = [], [pid]
    while todo:
        found.append(current := todo.pop())
        todo += [child for child, parent in parents.items() if parent == current]
    return found


def _stat(path: Path) -> list[str]:
    """The fields of a /proc stat file after the command name (which may hold spaces)."""
    return path.read_text().rpartition(")")[2].split()


def _cpu(path: Path) -> float:
    fields = _stat(path)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and every descendant, from /proc."""
    total = 0.0
    for member in tree(pid):
        with contextlib.suppress(OSError):
            total += _cpu(Path(f"/proc/{member}/stat"))
    return total


def each_process(pid: int) -> dict[int, float]:
    """utime + stime of each process of ``pid``'s tree."""
    seconds = {}
    for member in tree(pid):
        with contextlib.suppress(OSError):
            seconds[member] = _cpu(Path(f"/proc/{member}/stat"))
    return seconds


def own_and_descendants(pid: int) -> tuple[float, float]:
    """utime + stime of ``pid`` itself, and of its descendants (a server's worker or stub
    processes) together."""
    own = descendants = 0.0
    for member in tree(pid):
        with contextlib.suppress(OSError):
            seconds = _cpu(Path(f"/proc/{member}/stat"))
            if member == pid:
                own = seconds
            else:
                descendants += seconds
    return own, descendants


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of the gateway's threads by role: each process's main thread runs the event
    loop (HTTP, multipart, admission, the gRPC calls, logs, metrics); the decode pool's threads
    are the other Python threads; gRPC's C core names its own."""
    roles: dict[str, float] = {}
    for member in tree(pid):
        for task in Path(f"/proc/{member}/task").glob("*"):
            try:
                name, seconds = (task / "comm").read_text().strip(), _cpu(task / "stat")
            except OSError:
                continue
            if task.name == str(member):
                role = "event loop thread"
            elif name.startswith("python"):
                role = "decode threads"
            elif name.startswith(("event_engine", "grpc", "default-executo", "resolver")):
                role = "gRPC core threads"
            else:
                role = "other threads"
            roles[role] = roles.get(role, 0.0) + seconds
    return roles


def per_cpu_second_for(
    work: Callable[[bytes], object], images: list[bytes], seconds: float
) -> float:
    """Images per CPU-second of this thread running ``work`` over ``images``, whole passes until
    ``seconds`` of its CPU time are spent (at least one pass)."""
    for data in images[:2]:
        work(data)
    started, done = time.thread_time(), 0
    while True:
        for data in images:
            work(data)
        done += len(images)
        if (spent := time.thread_time() - started) >= seconds:
            return done / spent


def per_cpu_second(work: Callable[[bytes], object], images: list[bytes], rounds: int) -> float:
    """Images per CPU-second of this thread running ``work`` over ``images``."""
    for data in images[:2]:
        work(data)
    started = time.thread_time()
    for _ in range(rounds):
        for data in images:
            work(data)
    return rounds * len(images) / (time.thread_time() - started)
