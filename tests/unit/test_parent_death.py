"""config/processes.py's stop_with_parent: a child started with it gets SIGTERM when its parent
dies, and one whose parent is already gone does not run at all."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from clip_gateway.config.processes import stop_with_parent

#: prctl(PR_GET_PDEATHSIG) from inside the child: the signal it gets when its parent dies
PRINT_SIGNAL = (
    "import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); print(s.value)"
)


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_a_child_gets_sigterm_when_its_parent_dies() -> None:
    child = subprocess.run(
        [sys.executable, "-c", PRINT_SIGNAL],
        preexec_fn=functools.partial(stop_with_parent, os.getpid()),
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "15"


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_a_child_whose_parent_is_already_gone_exits_before_it_runs() -> None:
    # pid 1 is never this test's process: the child sees a parent other than the one named
    child = subprocess.run(
        [sys.executable, "-c", "print('ran')"],
        preexec_fn=functools.partial(stop_with_parent, 1),
        capture_output=True,
        text=True,
    )
    assert (child.returncode, child.stdout) == (1, "")
