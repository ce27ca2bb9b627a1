"""Run a check as a user without privileges: tests run as root on CI machines, and root reads
and writes anywhere, so a permission problem (a volume another uid owns, a private directory)
shows only for another uid."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def as_unprivileged(action: Callable[[], str]) -> str:
    """``action()`` in a forked child that dropped to uid/gid 65534 first when run as root (root
    writes anywhere); what it returned, or its exception's type and text."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            try:
                answer = action()
            except BaseException as exc:
                answer = f"{type(exc).__name__}: {exc}"
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        text = answer.read().decode()
    os.waitpid(pid, 0)
    return text


@contextlib.contextmanager
def open_directory() -> Iterator[Path]:
    """A scratch directory every uid can reach (pytest's tmp_path sits under a 0700 one)."""
    directory = Path(tempfile.mkdtemp(prefix="clip-gateway-test-", dir="/tmp"))
    try:
        directory.chmod(0o755)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
