"""``python -m gateway`` / ``clip-gateway``: run the gateway under uvicorn (settings from env)."""

from __future__ import annotations

import os
import sys
import tempfile

import uvicorn

from gateway.logs import configure, logging_config
from gateway.settings import GatewaySettings


def main(argv: list[str] | None = None) -> int:
    settings = GatewaySettings()
    configure(settings.log_level, settings.log_format)
    workers = settings.workers or max(1, (os.cpu_count() or 2) // 2)
    # Worker processes rebuild the settings from the environment: make the resolved count theirs.
    os.environ["GATEWAY_WORKERS"] = str(workers)
    if workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Each worker has its own counters; prometheus-client aggregates them through files here.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
    uvicorn.run(
        "gateway.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        fd=settings.listen_fd,
        workers=workers,
        log_level=settings.log_level.lower(),
        access_log=False,
        limit_concurrency=settings.max_connections or None,
        log_config=logging_config(settings.log_level, settings.log_format),
        timeout_graceful_shutdown=int(settings.request_timeout_s),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
