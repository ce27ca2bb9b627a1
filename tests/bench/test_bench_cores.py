"""bench/harness/cores.py: the CPU topology from lscpu, the split of a host's cores between the
gateway, Triton and the load generators from what each side measured per image, and moving a
running process tree onto its cores."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.harness.cores import Cores, Topology, pin_tree, triton_share
from bench.harness.cpu import own_and_descendants, tree

#: A 16-vCPU host whose "cores" are 8 physical cores with two threads each, siblings i and i + 8
#: (how Linux numbers SMT threads on most Xeons), as `lscpu -p=CPU,CORE,SOCKET,NODE` prints it.
SMT_16 = "# CPU,Core,Socket,Node\n" + "".join(f"{cpu},{cpu % 8},0,0\n" for cpu in range(16))
SMT_16_SUMMARY = """CPU(s):                   16
Thread(s) per core:       2
Core(s) per socket:       8
Socket(s):                1
NUMA node(s):             1
"""
FLAT_16 = "# CPU,Core,Socket,Node\n" + "".join(f"{cpu},{cpu},0,0\n" for cpu in range(16))
FLAT_SUMMARY = SMT_16_SUMMARY.replace("per core:       2", "per core:       1").replace(
    "per socket:       8", "per socket:       16"
)


def test_smt_siblings_are_read_and_recorded() -> None:
    topology = Topology.parse(SMT_16, SMT_16_SUMMARY, range(16))
    assert topology.cores == tuple((core, core + 8) for core in range(8))
    assert topology.record() == {
        "source": "lscpu", "threads_per_core": 2, "cores_per_socket": 8, "sockets": 1,
        "numa_nodes": 1, "physical_cores": 8,
        "smt_siblings": [[core, core + 8] for core in range(8)],
    }  # fmt: skip


def test_the_gateways_workers_take_distinct_physical_cores_first() -> None:
    topology = Topology.parse(SMT_16, SMT_16_SUMMARY, range(16))
    cores = Cores.split(list(range(16)), topology)
    # siblings stay together: the load generators on the last two physical cores, Triton's
    # unmeasured three next, the gateway on the rest
    assert cores.load == (6, 14, 7, 15)
    assert cores.triton == (12, 5, 13)
    assert set(cores.gateway) == {0, 8, 1, 9, 2, 10, 3, 11, 4}
    # 1, 2, 4 workers on as many physical cores; the fifth core before any second thread
    assert cores.gateway == (0, 1, 2, 3, 4, 8, 9, 10, 11)
    assert len({cpu % 8 for cpu in cores.gateway[:5]}) == 5


def test_triton_gets_the_share_of_cores_its_cpu_per_image_says() -> None:
    topology = Topology.parse(FLAT_16, FLAT_SUMMARY, range(16))
    split = Cores.split(list(range(16)), topology, triton_share(750.0, 250.0))
    assert (len(split.gateway), len(split.triton), len(split.load)) == (9, 3, 4)  # 0.25 x 12
    split = Cores.split(list(range(16)), topology, triton_share(700.0, 300.0))
    assert (len(split.gateway), len(split.triton)) == (8, 4)  # ceil(0.3 x 12) = 4
    assert split.triton == (8, 9, 10, 11) and split.load == (12, 13, 14, 15)
    # Triton never under MIN_TRITON_CPUS: the H200 host's calibration share, 0.083 x 12, gave
    # it one CPU, and its Python backend stalled there (bench/results/host/host.md)
    assert len(Cores.split(list(range(16)), topology, 0.083).triton) == 3
    assert len(Cores.split(list(range(16)), topology, 0.0).triton) == 3
    assert len(Cores.split(list(range(16)), topology, 1.0).gateway) == 1
    assert Cores.split(list(range(16)), topology).triton == (9, 10, 11)  # unmeasured: 3


def test_under_twelve_cpus_nothing_is_pinned() -> None:
    split = Cores.split(list(range(11)), None, 0.5)
    assert not split.pinned and split.triton == split.load == ()


def test_triton_share_needs_both_figures() -> None:
    assert triton_share(600.0, 200.0) == pytest.approx(0.25)
    assert triton_share(None, 200.0) is None and triton_share(600.0, None) is None
    assert triton_share(0.0, 0.0) is None


def test_a_cpu_lscpu_leaves_out_is_a_core_of_its_own() -> None:
    topology = Topology.parse(FLAT_16, FLAT_SUMMARY, [0, 1, 99])
    assert topology.cores == ((99,), (0,), (1,))
    assert Topology.parse("", "", [3, 2]).record()["threads_per_core"] is None


def test_this_machines_topology_covers_every_usable_cpu() -> None:
    usable = sorted(os.sched_getaffinity(0))
    topology = Topology.read(usable)
    assert sorted(topology.ordered()) == usable
    assert sorted(topology.physical_first(usable)) == usable


def test_a_running_tree_is_moved_onto_its_cores_and_its_cpu_split(tmp_path: Path) -> None:
    """A parent with a child, both spinning: every thread of both lands on the one CPU given,
    and the CPU time is split between the parent and its descendants."""
    script = tmp_path / "tree.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "print(child.pid, flush=True)\n"
        "end = time.monotonic() + 600\n"
        "while time.monotonic() < end: pass\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    try:
        child = int(parent.stdout.readline())
        assert tree(parent.pid) == [parent.pid, child]
        target = (max(os.sched_getaffinity(0)),)
        assert pin_tree(parent.pid, target) >= 2
        for pid in (parent.pid, child):
            for task in Path(f"/proc/{pid}/task").iterdir():
                assert os.sched_getaffinity(int(task.name)) == set(target)
        deadline = time.monotonic() + 120  # both spin: each is charged its first tick soon
        while min(own_and_descendants(parent.pid)) <= 0.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        own, descendants = own_and_descendants(parent.pid)
        assert own > 0.0 and descendants > 0.0
        assert pin_tree(parent.pid, ()) == 0  # no cores: left as it is
    finally:
        for pid in tree(parent.pid)[::-1]:
            os.kill(pid, 9)
        parent.wait()
        parent.stdout.close()
