"""``python -m clip_gateway.http``: the gateway's HTTP process (uvicorn, its workers, the app).

Started by the supervisor (launcher/supervisor.py) with its listening socket and worker plan in
the environment; run by hand, it binds ``GATEWAY_HOST:GATEWAY_PORT`` and plans for itself.
"""

from __future__ import annotations

import os
import sys

import uvicorn

from clip_gateway.config.plan import plan_for
from clip_gateway.config.settings import ServerSettings, exposure_problem
from clip_gateway.http.connections import DeadlineProtocol
from clip_gateway.observability.logs import configure, logging_config


def main() -> int:
    settings = ServerSettings()
    configure(settings.log_level, settings.log_format)
    problem = exposure_problem(settings)
    if problem is not None:  # the launcher checks first; run by hand, this process does
        raise SystemExit(problem)
    planned = plan_for(settings.workers, settings.decode_threads, settings.max_decode_mib)
    # uvicorn's workers build their settings from the environment: make the plan theirs
    os.environ["GATEWAY_WORKERS"] = str(planned.workers)
    os.environ["GATEWAY_DECODE_THREADS"] = str(planned.decode_threads)
    if planned.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        raise SystemExit(
            "several workers need PROMETHEUS_MULTIPROC_DIR (a private, empty directory) for "
            "their metrics; the supervisor (clip-gateway serve) sets it"
        )
    uvicorn.run(
        "clip_gateway.http.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        fd=settings.listen_fd,
        workers=planned.workers,
        log_level=settings.log_level.lower(),
        access_log=False,
        limit_concurrency=settings.max_connections or None,
        http=DeadlineProtocol,
        log_config=logging_config(settings.log_level, settings.log_format),
        timeout_graceful_shutdown=int(settings.drain_s),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
