"""``python -m clip_gateway.http``: the gateway's HTTP process (uvicorn, its workers, the app).

Started by the supervisor (launcher/supervisor.py) with its listening socket and worker plan in
the environment; run by hand, it binds ``GATEWAY_HOST:GATEWAY_PORT`` and plans for itself. Before
its workers start it finds this machine's decode speed (pipeline/decode_speed.py: recorded, or
measured now and kept) and hands it to them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from clip_gateway.config.plan import plan_for
from clip_gateway.config.settings import ServerSettings, exposure_problem, use_new_names
from clip_gateway.http import spread
from clip_gateway.http.app import ServerConfig
from clip_gateway.model.spec import default_cache_dir
from clip_gateway.observability.logs import configure, logging_config
from clip_gateway.pipeline import decode_speed

log = logging.getLogger("gateway.http")


def main() -> int:
    settings = ServerSettings()
    configure(settings.log_level, settings.log_format)
    problem = exposure_problem(settings)
    if problem is not None:  # the launcher checks first; run by hand, this process does
        raise SystemExit(problem)
    planned = plan_for(settings.workers, settings.decode_threads, settings.max_decode_mib)
    # uvicorn's workers build their settings from the environment: make the plan theirs, and
    # renamed variables theirs under the new names (this process has warned of the old)
    use_new_names(os.environ)
    os.environ["GATEWAY_WORKERS"] = str(planned.workers)
    os.environ["GATEWAY_DECODE_THREADS"] = str(planned.decode_threads)
    if settings.decode_speed_check == "measure" and not settings.decode_speed:
        os.environ["GATEWAY_DECODE_SPEED"] = json.dumps(measured_decode_speed(settings))
    if planned.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        raise SystemExit(
            "several workers need PROMETHEUS_MULTIPROC_DIR (a private, empty directory) for "
            "their metrics; the supervisor (clip-gateway serve) sets it"
        )
    with contextlib.ExitStack() as stack:
        board = None
        if planned.workers > 1:  # the workers' open connections, so they share them evenly
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="clip-gateway-http-"))
            board = Path(scratch) / "connections"
            spread.Board.create(board, planned.workers)
        config = ServerConfig(
            "clip_gateway.http.app:create_app",  # built by ServerConfig in each worker
            factory=True,
            host=settings.host,
            port=settings.port,
            fd=settings.listen_fd,
            workers=planned.workers,
            log_level=settings.log_level.lower(),
            access_log=False,
            limit_concurrency=settings.max_connections or None,
            log_config=logging_config(settings.log_level, settings.log_format),
            timeout_graceful_shutdown=int(settings.drain_s),
            board=board,
        )
        # what uvicorn.run does, with this config (it would build its own from keywords)
        server = uvicorn.Server(config)
        with contextlib.suppress(KeyboardInterrupt):
            if config.workers > 1:
                Multiprocess(config, sockets=[config.bind_socket()]).run()
            else:
                server.run()
    if config.workers == 1 and not server.started:
        return STARTUP_FAILURE
    return 0


def measured_decode_speed(settings: ServerSettings) -> dict[str, float]:
    """This machine's decode speed per coding, recorded or measured now (and kept), logged."""
    records = [default_cache_dir() / decode_speed.RECORD]
    if settings.decode_speed_record is not None:
        records.insert(0, Path(settings.decode_speed_record))
    speed, source = decode_speed.for_this_machine(records)
    log.info("decode speed here, as multiples of the factors (%s): %s", source, speed.summary())
    return speed.speeds


if __name__ == "__main__":
    sys.exit(main())
