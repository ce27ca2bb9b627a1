"""``python -m gateway`` / ``clip-gateway``: run the gateway under uvicorn (settings from env)."""

from __future__ import annotations

import logging
import os
import sys

import uvicorn

from gateway.settings import GatewaySettings


def main(argv: list[str] | None = None) -> int:
    settings = GatewaySettings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    workers = settings.workers or max(1, (os.cpu_count() or 2) // 2)
    # Worker processes rebuild the settings from the environment: make the resolved count theirs.
    os.environ["GATEWAY_WORKERS"] = str(workers)
    uvicorn.run(
        "gateway.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=workers,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=int(settings.request_timeout_s),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
