"""``clip-gateway imaging``: the image path of this install (also the install's pillow-simd
check); it imports only clip_gateway/imaging/paths.py, so it reports the PIL first on the path."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from clip_gateway.exits import Exit
from clip_gateway.imaging import paths


@click.command()
@click.option(
    "--require-simd",
    is_flag=True,
    show_default="off",
    help="Exit 1 unless pillow-simd is the PIL here (the install's check).",
)
def imaging(require_simd: bool) -> int:
    """Print the libraries that decode and resize images here (clip_gateway/imaging/paths.py) as
    JSON: the same the gateway reports in its ready line and /v1/models."""
    path = paths.current()
    click.echo(json.dumps(asdict(path)))
    if require_simd and not path.simd:
        click.echo(
            f"error: PIL here is {path.resize}, not pillow-simd: the image resize runs the slow "
            "path (PILLOW_SIMD=0 accepts it)",
            err=True,
        )
        return Exit.ERROR
    return Exit.OK
