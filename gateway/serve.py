"""``make serve``: export if needed, start the local Triton, run the gateway in the foreground.

Ctrl-C stops the gateway first (uvicorn drains in-flight requests), then Triton.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvicorn

from gateway.app import create_app
from gateway.localtriton import LocalTriton
from gateway.logs import configure, logging_config
from gateway.repository import PROFILES, RepositorySettings, render
from gateway.settings import GatewaySettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway.serve", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--weights",
        default="laion2b_s34b_b79k",
        help="open_clip pretrained tag, a checkpoint path, or 'random' (tests/benchmarks)",
    )
    parser.add_argument("--model", default="ViT-B-32")
    parser.add_argument("--profile", choices=PROFILES, default="cpu")
    parser.add_argument("--cache-dir", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure("INFO", "text")
    # The export extra (torch) is only needed here, for the first run's export.
    from export.__main__ import weights_from_spec
    from export.build import default_cache_dir, ensure_exported
    from export.model import WeightsUnavailableError

    cache_dir = args.cache_dir or default_cache_dir()
    try:
        exported = ensure_exported(args.model, weights_from_spec(args.weights), cache_dir)
    except WeightsUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    repository = render(
        RepositorySettings(profile=args.profile),
        exported.directory,
        cache_dir / "serve" / args.profile / "model_repository",
    )
    with LocalTriton(repository) as triton:
        settings = GatewaySettings(host=args.host, port=args.port, triton_url=triton.grpc_url)
        print(
            f"CLIP gateway on http://{args.host}:{args.port} (Triton {args.profile} profile, "
            f"gRPC {triton.grpc_url}); API docs at /docs. Ctrl-C stops both.",
            flush=True,
        )
        uvicorn.run(
            create_app(settings),
            host=args.host,
            port=args.port,
            log_config=logging_config("INFO", "text"),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
