"""Every stop and start-up timing, derived from one set of settings so none can drift apart.

The inputs are settings (``GATEWAY_REQUEST_TIMEOUT_S``, ``GATEWAY_DRAIN_S``,
``GATEWAY_STOP_DELAY_S``, ``GATEWAY_TRITON_GRACE_S``, ``GATEWAY_STARTUP_TIMEOUT_S``); everything
an orchestrator must be told (Kubernetes' grace period and probes, Docker's HEALTHCHECK start
period, compose's stop grace period) follows from them here. Deploy files are YAML and cannot
compute, so they carry the numbers, and ``tests/unit/test_deploy.py`` checks each file against
``derive()`` for the settings that file sets; ``clip-gateway timings`` prints them.

A stop, after SIGTERM: stop delay (still serving: endpoints and load balancers let go of the pod) →
gateway drain (no new connections; in-flight requests finish) → gateway exit → Triton exit. Every
step has a bound, and the orchestrator's kill comes only after their sum plus headroom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clip_gateway.config.settings import Settings

#: The longest ``/readyz`` waits on Triton (the model-ready call's deadline, backend/triton.py).
READY_CHECK_TIMEOUT_S = 5.0
#: After the drain: uvicorn cancels what is left, runs the lifespan shutdown (closing the gRPC
#: channel, removing shared-memory regions) and its workers exit.
GATEWAY_EXIT_S = 5.0
#: Before Triton is READY nothing is in flight and nothing is worth waiting for: a model load
#: or TensorRT engine build is abandoned (the engines of a start-up that was stopped are
#: removed, clip_gateway/profiles/engines.py), so Triton gets only this long before SIGKILL.
TRITON_STARTUP_GRACE_S = 3.0
#: Kept between our worst case and the orchestrator's kill: scheduling, a slow node, logs.
HEADROOM_S = 10.0
#: The startup probe's period: its failure threshold is derived from the start-up budget.
STARTUP_PERIOD_S = 10


@dataclass(frozen=True)
class Timings:
    """Seconds; the first block comes from settings, the rest is derived."""

    request_timeout_s: float
    drain_s: float
    stop_delay_s: float
    triton_grace_s: float
    startup_timeout_s: float
    #: The gateway process's SIGKILL deadline after its SIGTERM: drain, then exit.
    gateway_stop_s: float
    #: Worst case from SIGTERM to the supervisor's exit while serving.
    stop_s: float
    #: What the orchestrator must wait before SIGKILL (k8s terminationGracePeriodSeconds,
    #: compose stop_grace_period, ``docker stop -t``).
    kill_after_s: int
    #: Probe timeout for /readyz (it may wait READY_CHECK_TIMEOUT_S on Triton).
    readiness_timeout_s: int
    #: The startup probe's budget (period × failures) and Docker's HEALTHCHECK start period:
    #: longer than the supervisor's own start-up timeout, so the supervisor gives up first and
    #: says why, instead of being killed mid-build without a word.
    startup_probe_failures: int
    healthcheck_start_period_s: int

    def problems(self) -> list[str]:
        """Settings that cannot work together (empty when consistent)."""
        found = []
        if self.drain_s < self.request_timeout_s:
            found.append(
                f"GATEWAY_DRAIN_S ({self.drain_s:g}) is shorter than GATEWAY_REQUEST_TIMEOUT_S "
                f"({self.request_timeout_s:g}): a stop would cut off requests still within "
                "their deadline"
            )
        return found


def derive(settings: Settings) -> Timings:
    server, launch = settings.server, settings.launch
    gateway_stop = server.drain_s + GATEWAY_EXIT_S
    stop = launch.stop_delay_s + gateway_stop + launch.triton_grace_s
    startup_budget = launch.startup_timeout_s + HEADROOM_S
    return Timings(
        request_timeout_s=server.request_timeout_s,
        drain_s=server.drain_s,
        stop_delay_s=launch.stop_delay_s,
        triton_grace_s=launch.triton_grace_s,
        startup_timeout_s=launch.startup_timeout_s,
        gateway_stop_s=gateway_stop,
        stop_s=stop,
        kill_after_s=math.ceil(stop + HEADROOM_S),
        readiness_timeout_s=math.ceil(READY_CHECK_TIMEOUT_S + 1),
        startup_probe_failures=math.ceil(startup_budget / STARTUP_PERIOD_S),
        healthcheck_start_period_s=math.ceil(startup_budget),
    )
