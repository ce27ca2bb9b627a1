"""What CPU this is, from ``/proc/cpuinfo``: what a measurement made here holds for (``auto``'s
CPU profile choice, profiles/cpu_auto.py; the decode speed, pipeline/decode_speed.py) and which
units it has (``cpu-bf16``, profiles/bf16.py)."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The first processor's model name (``unknown`` where there is none)."""
    return _first(cpuinfo, "model name") or "unknown"


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The first processor's flags (empty where there is no /proc/cpuinfo or no flags line)."""
    return frozenset((_first(cpuinfo, "flags") or "").split())


def _first(cpuinfo: Path, name: str) -> str | None:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None
