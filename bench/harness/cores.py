"""Which cores each part of a one-host run gets: the machine's CPU topology (lscpu: SMT siblings,
cores per socket, NUMA nodes), the split of its cores between the gateway, Triton and the load
generators from what each measured per image, and pinning (inherited at fork, or set on a running
process tree)."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.cpu import tree

#: Fewer usable CPUs than this: nothing is pinned (a 2-core machine cannot split three ways).
MIN_PINNED = 12
#: The load generators' CPUs: four closed-loop processes, one each.
LOAD_CPUS = 4
#: Triton's CPUs before anything is measured (the first GPU host run's split).
UNMEASURED_TRITON_CPUS = 3
#: Triton's fewest CPUs whatever its share. On the H200 host (bench/results/host, 2026-11-30)
#: a share of 0.083 gave it one CPU, and there the null model executed 40-58 times a second
#: with Triton's processes ~8 % busy, against 551 a second on 3 CPUs the cell before: the
#: gateway's throughput then fell as workers were added. Every cell that scaled had 3 or more.
MIN_TRITON_CPUS = 3


@dataclass(frozen=True)
class Topology:
    """Logical CPUs grouped by the physical core they share (SMT siblings together), ordered by
    NUMA node, socket and core; and lscpu's own summary of the machine."""

    cores: tuple[tuple[int, ...], ...]
    threads_per_core: int | None = None
    cores_per_socket: int | None = None
    sockets: int | None = None
    numa_nodes: int | None = None
    source: str = "lscpu"

    @classmethod
    def read(cls, available: Iterable[int]) -> Topology:
        """This machine's, restricted to ``available``; one core per CPU where lscpu fails."""
        try:
            parsable = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True,
                                      text=True, check=True, timeout=30).stdout  # fmt: skip
            summary = subprocess.run(["lscpu"], capture_output=True, text=True, check=True,
                                     timeout=30).stdout  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return cls(tuple((cpu,) for cpu in sorted(available)), source="unknown (no lscpu)")
        return cls.parse(parsable, summary, available)

    @classmethod
    def parse(cls, parsable: str, summary: str, available: Iterable[int]) -> Topology:
        """From ``lscpu -p=CPU,CORE,SOCKET,NODE`` and ``lscpu``'s summary."""
        wanted = set(available)
        groups: dict[tuple[int, int, int], list[int]] = {}
        for line in parsable.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            cpu, core, socket, node = ([*line.split(","), "", "", ""])[:4]
            if int(cpu) not in wanted:
                continue
            # a field lscpu cannot tell is empty: that CPU is then a core of its own
            key = (_int(node), _int(socket), _int(core) if core else -1 - int(cpu))
            groups.setdefault(key, []).append(int(cpu))
        listed = {listed_cpu for group in groups.values() for listed_cpu in group}
        for alone in wanted - listed:  # not listed by lscpu (offline meanwhile): a core alone
            groups[(-1, -1, -1 - alone)] = [alone]
        fields = dict(line.split(":", 1) for line in summary.splitlines() if ":" in line)

        def field(name: str) -> int | None:
            value = fields.get(name, "").strip()
            return int(value) if value.isdigit() else None

        return cls(
            tuple(tuple(sorted(groups[key])) for key in sorted(groups)),
            threads_per_core=field("Thread(s) per core"),
            cores_per_socket=field("Core(s) per socket"),
            sockets=field("Socket(s)"),
            numa_nodes=field("NUMA node(s)"),
        )

    def ordered(self) -> list[int]:
        """Every CPU, SMT siblings next to each other: contiguous slices share few cores."""
        return [cpu for core in self.cores for cpu in core]

    def physical_first(self, cpus: Iterable[int]) -> list[int]:
        """``cpus`` with the first thread of each physical core before any core's second one:
        the first n of them are n distinct cores while there are that many."""
        thread = {cpu: i for core in self.cores for i, cpu in enumerate(core)}
        position = {cpu: i for i, cpu in enumerate(self.ordered())}
        return sorted(cpus, key=lambda cpu: (thread.get(cpu, 0), position.get(cpu, cpu)))

    def record(self) -> dict[str, Any]:
        """What host.json keeps: lscpu's figures and which CPUs are SMT siblings."""
        return {
            "source": self.source,
            "threads_per_core": self.threads_per_core,
            "cores_per_socket": self.cores_per_socket,
            "sockets": self.sockets,
            "numa_nodes": self.numa_nodes,
            "physical_cores": len(self.cores),
            "smt_siblings": [list(core) for core in self.cores if len(core) > 1],
        }


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else -1


@dataclass(frozen=True)
class Cores:
    """Which CPUs the gateway, Triton and the load generators run on (empty: not pinned). The
    gateway's are in the order its workers take them: distinct physical cores first."""

    gateway: tuple[int, ...]
    triton: tuple[int, ...]
    load: tuple[int, ...]

    @classmethod
    def split(
        cls,
        available: list[int],
        topology: Topology | None = None,
        triton_share: float | None = None,
    ) -> Cores:
        """The load generators on the last ``LOAD_CPUS``; of the rest, Triton gets
        ``ceil(triton_share * rest)`` (at least ``MIN_TRITON_CPUS``, at most all but one;
        ``UNMEASURED_TRITON_CPUS`` before a measurement), the gateway the others.
        ``triton_share``: Triton's CPU per image over the gateway's and Triton's together, as
        measured."""
        if len(available) < MIN_PINNED:
            return cls((), (), ())
        topology = topology or Topology(tuple((cpu,) for cpu in sorted(available)), source="")
        listed = set(topology.ordered())
        order = [cpu for cpu in topology.ordered() if cpu in set(available)]
        order += sorted(set(available) - listed)
        load, rest = order[-LOAD_CPUS:], order[:-LOAD_CPUS]
        if triton_share is None:
            count = UNMEASURED_TRITON_CPUS
        else:  # the float's last bit must not cost Triton a core (0.25 x 12 is 3, not 4)
            count = math.ceil(round(triton_share * len(rest), 9))
        count = min(len(rest) - 1, max(MIN_TRITON_CPUS, count))
        gateway = topology.physical_first(rest[:-count])
        return cls(tuple(gateway), tuple(rest[-count:]), tuple(load))

    @property
    def pinned(self) -> bool:
        return bool(self.gateway)

    def gateway_count(self) -> int:
        return len(self.gateway) or len(os.sched_getaffinity(0))


def triton_share(gateway_us: float | None, triton_us: float | None) -> float | None:
    """Triton's part of the CPU one image costs both sides (None without both figures)."""
    if not gateway_us or triton_us is None or gateway_us + triton_us <= 0:
        return None
    return triton_us / (gateway_us + triton_us)


@contextlib.contextmanager
def pinned(cores: tuple[int, ...]) -> Iterator[None]:
    """Children started inside run on ``cores`` (affinity is inherited at fork)."""
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin_tree(pid: int, cores: tuple[int, ...]) -> int:
    """Move every thread of ``pid`` and its descendants onto ``cores`` (a running server after
    its split is measured); how many threads were moved. Nothing with no cores."""
    moved = 0
    if not cores:
        return moved
    for member in tree(pid):
        for task in Path(f"/proc/{member}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):  # a thread gone meanwhile
                os.sched_setaffinity(int(task.name), cores)
                moved += 1
    return moved
