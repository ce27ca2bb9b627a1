"""The quality gates: one per profile that serves something cheaper than the export's FP32 graphs,
behind one protocol (``Gate``): ``cpu-int8`` (the export's ONNX Runtime INT8 files), ``cpu-bf16``
(OpenVINO at BF16, profiles/bf16.py) and ``cpu-int8-openvino`` (NNCF's INT8, built here at the
first start: profiles/int8_openvino.py). Each measures or reads its figures (per tower, cosine
vs FP32 on the calibration set) and holds them to this launch's thresholds with the one
refusal text (clip_gateway/model/gate.py ``refusal``); ``enforce`` then refuses the launch, or
lets the FP32 graphs serve in the profile's place where its fallback is allowed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from clip_gateway.config import plan
from clip_gateway.config.processes import LaunchError
from clip_gateway.config.settings import Profile, Settings
from clip_gateway.model import gate
from clip_gateway.profiles import bf16, int8_openvino
from clip_gateway.profiles.host import Host
from clip_gateway.profiles.plans import model_plan

log = logging.getLogger(__name__)

#: Why an OpenVINO profile may not serve under Triton's onnxruntime backend (the NGC image's).
PYTHON_BACKEND_ONLY = "OpenVINO runs in the Python backend only (GATEWAY_TRITON_CPU_BACKEND=python)"


@dataclass(frozen=True)
class Verdict:
    """What a gate found: why its profile may not serve here (None: it may), and what
    /v1/models shows of it (keyword arguments of launcher/repository.py ``render``)."""

    refused: str | None
    notes: dict[str, Any] = field(default_factory=dict)


class Gate(Protocol):
    #: the profile it lets through or refuses
    profile: ClassVar[Profile]
    #: what its refusal names ("INT8", "BF16", "OpenVINO INT8")
    subject: ClassVar[str]
    #: the setting that lets the FP32 graphs serve in its place when refused; None: nothing does
    fallback: ClassVar[str | None]
    #: what an operator may serve instead
    instead: ClassVar[str]
    #: the operator set ``fallback``
    allowed: bool

    def check(self, export_dir: Path, deadline: float) -> Verdict:
        """The profile's figures for this export, held to the gate; measured (or built) where
        none is kept, within ``deadline``."""
        ...


def manifest(export_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((export_dir / "manifest.json").read_text())
    return data


@dataclass
class OrtInt8:
    """``cpu-int8``: the export's INT8 files (ONNX Runtime's dynamic INT8), whose figures the
    exporter recorded in the manifest."""

    profile: ClassVar[Profile] = "cpu-int8"
    subject: ClassVar[str] = "INT8"
    fallback: ClassVar[str | None] = "GATEWAY_INT8_FALLBACK"
    instead: ClassVar[str] = "cpu profile"
    thresholds: gate.Thresholds
    allowed: bool = False

    def check(self, export_dir: Path, deadline: float) -> Verdict:
        int8 = manifest(export_dir).get("int8") or {}
        refused = (
            gate.refusal(int8.get("figures") or {}, self.thresholds)
            if int8.get("files")
            else "the export has no INT8 files: export again with --int8"
        )
        return Verdict(refused, {"int8_fallback": refused})


@dataclass
class OpenvinoBf16:
    """``cpu-bf16``: OpenVINO runs the FP32 graphs at BF16, only on a CPU with BF16 units; its
    figures measured at the first start for the export and OpenVINO version, kept beside it."""

    profile: ClassVar[Profile] = "cpu-bf16"
    subject: ClassVar[str] = "BF16"
    fallback: ClassVar[str | None] = "GATEWAY_BF16_FALLBACK"
    instead: ClassVar[str] = "cpu or cpu-int8 profile"
    host: Host
    thresholds: gate.Thresholds
    cpu_backend: str
    allowed: bool = False

    def check(self, export_dir: Path, deadline: float) -> Verdict:
        version: str | None = None
        measured: dict[str, Any] = {}
        if (unit := bf16.bf16_flag(bf16.cpu_flags())) is None:
            units = ", ".join(bf16.BF16_FLAGS)
            refused: str | None = (
                f"this CPU has no BF16 units (neither of {units} in /proc/cpuinfo's flags)"
            )
        elif self.cpu_backend != "python":
            refused = PYTHON_BACKEND_ONLY
        else:
            self.host.progress(f"cpu-bf16: {unit}; checking OpenVINO BF16 against FP32")
            try:
                threads = model_plan("cpu-bf16", plan.usable_cpus()).threads
                version, measured = bf16.figures(
                    export_dir, self.host.python(), self.host.script("bf16_check.py"), threads,
                    timeout=within(bf16.CHECK_SECONDS, deadline), stop=self.host.stop.is_set,
                )  # fmt: skip
                refused = gate.refusal(measured, self.thresholds, self.subject,
                                       f"measure them again (remove {bf16.RECORD})")  # fmt: skip
            except bf16.Bf16Unavailable as exc:
                refused = str(exc)
        return Verdict(refused, {"bf16": bf16.section(version, measured, self.thresholds, refused)})


@dataclass
class OpenvinoInt8:
    """``cpu-int8-openvino``: NNCF's INT8 in OpenVINO IR, built beside the export at the first
    start for the model (minutes) and kept with its figures."""

    profile: ClassVar[Profile] = "cpu-int8-openvino"
    subject: ClassVar[str] = "OpenVINO INT8"
    fallback: ClassVar[str | None] = None  # an operator who named it chose INT8 on OpenVINO
    instead: ClassVar[str] = "cpu or cpu-int8 profile"
    host: Host
    thresholds: gate.Thresholds
    cpu_backend: str
    allowed: bool = False

    def check(self, export_dir: Path, deadline: float) -> Verdict:
        if self.cpu_backend != "python":
            return Verdict(PYTHON_BACKEND_ONLY)
        python, script = self.host.python(), self.host.script("int8_openvino_build.py")
        rest = int8_openvino.rest_precision(bf16.cpu_flags())
        threads = model_plan(self.profile, plan.usable_cpus()).threads
        if int8_openvino.kept(export_dir) is None:
            self.host.progress("cpu-int8-openvino: quantizing with NNCF (once per model; minutes)")
        started = time.monotonic()
        try:
            record = int8_openvino.figures(
                export_dir, python, script, threads, rest,
                timeout=within(int8_openvino.BUILD_SECONDS, deadline), stop=self.host.stop.is_set,
            )  # fmt: skip
        except int8_openvino.Int8OpenvinoUnavailable as exc:
            return Verdict(str(exc))
        log.info("cpu-int8-openvino: built or found in %.0f s: %s", time.monotonic() - started,
                 json.dumps(record.get("figures")))  # fmt: skip
        return Verdict(gate.refusal(record.get("figures") or {}, self.thresholds, self.subject,
                                    f"build it again (remove {int8_openvino.RECORD})"))  # fmt: skip


def within(seconds: float, deadline: float) -> float:
    """A check's time limit: its own, cut to what is left of the start-up budget."""
    return max(1.0, min(seconds, deadline - time.monotonic()))


def thresholds(settings: Settings) -> gate.Thresholds:
    """This launch's gate (GATEWAY_INT8_MIN_MEAN_COSINE, _MIN_COSINE), for every kind."""
    return gate.Thresholds(settings.launch.int8_min_mean_cosine, settings.launch.int8_min_cosine)


def for_launch(settings: Settings, host: Host) -> dict[Profile, Gate]:
    """Each gated profile's gate for this launch, in the order ``auto`` checks them: the
    quickest first, NNCF's minutes-long build last (profiles/cpu_auto.py ``CANDIDATES``)."""
    limits, launch = thresholds(settings), settings.launch
    backend = settings.repository.cpu_backend
    found: list[Gate] = [OrtInt8(limits, launch.int8_fallback),
                         OpenvinoBf16(host, limits, backend, launch.bf16_fallback),
                         OpenvinoInt8(host, limits, backend)]  # fmt: skip
    return {each.profile: each for each in found}


def enforce(
    gated: Gate, verdict: Verdict, *, automatic: bool, progress: Callable[[str], None]
) -> str | None:
    """None where the gate let its profile through. Refused: a LaunchError saying why and what
    to do, unless its fallback is allowed (``automatic``: ``auto`` chose it; or the operator's
    setting), then why the FP32 graphs (the ``cpu`` profile's) serve in its place, said here."""
    refused = verdict.refused
    if refused is None:
        return None
    if gated.fallback is None or not (automatic or gated.allowed):
        also = f", or set {gated.fallback}=true to fall back to cpu" if gated.fallback else ""
        raise LaunchError(
            f"the {gated.profile} profile is refused: {refused}. Serve the {gated.instead}{also}"
        )
    by = "auto" if automatic else gated.fallback
    log.warning("%s refused (%s); serving the FP32 files instead (the cpu profile's, %s)",
                gated.profile, refused, by)  # fmt: skip
    progress(f"{gated.subject} refused, serving FP32 ({by}): {refused}")
    return f"{gated.subject} refused, FP32 serves: {refused}"
