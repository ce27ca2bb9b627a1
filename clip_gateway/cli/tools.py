"""The server's maintenance commands (the server extra): the settings reference, the derived
timings, and the model repository and Triton run by hand. Their flags are
settings fields too (options.py): one declaration, flag over environment over default."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from clip_gateway.cli.options import Flag, flag_options, resolve
from clip_gateway.cli.reference import page
from clip_gateway.cli.serve import SERVE_FLAGS
from clip_gateway.config import timings as derived
from clip_gateway.exits import Exit
from clip_gateway.launcher.local import LocalTriton
from clip_gateway.launcher.repository import render as render_repository

RENDER_FLAGS = (Flag("repository", "profile"),)
TRITON_FLAGS = (
    Flag("launch", "triton_grpc_port", "grpc-port"),
    Flag("launch", "triton_http_port", "http-port"),
    Flag("launch", "triton_metrics_port", "metrics-port"),
)
#: Every command that takes settings as flags: docs/CONFIGURATION.md's flag column.
COMMAND_FLAGS = {"serve": SERVE_FLAGS, "render": RENDER_FLAGS, "triton": TRITON_FLAGS}


@click.command()
def config() -> None:
    """Print every setting (its environment variable, flags, default and meaning) as the
    Markdown of docs/CONFIGURATION.md."""
    click.echo(page(COMMAND_FLAGS), nl=False)


@click.command()
def timings() -> int:
    """Print the stop and start-up bounds derived from the settings here (config/timings.py:
    the deploy files' numbers); exit 1 with the problems when they do not fit together."""
    found = derived.derive(resolve(click.get_current_context(), ()))
    for name, value in asdict(found).items():
        click.echo(f"{name:28} {value:g}")
    for problem in found.problems():
        click.echo(f"problem: {problem}", err=True)
    return Exit.ERROR if found.problems() else Exit.OK


@click.command()
@click.argument("export_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@flag_options(RENDER_FLAGS)
@click.option("--copy", is_flag=True, show_default="off", help="Copy the ONNX files, not link.")
@click.pass_context
def render(ctx: click.Context, /, export_dir: Path, out_dir: Path, copy: bool, **_: Any) -> int:
    """Render the Triton model repository of EXPORT_DIR (written by `python -m clip_gateway.export`)
    into OUT_DIR, as the launcher does (GATEWAY_TRITON_* settings); print the configs written."""
    settings = resolve(ctx, RENDER_FLAGS).repository
    if settings.profile == "auto":
        raise click.UsageError("profile auto is the launcher's choice: name one (--profile)")
    render_repository(settings, export_dir, out_dir, link=not copy)
    for written in sorted(out_dir.glob("*/config.pbtxt")):
        click.echo(str(written))
    return Exit.OK


@click.command()
@click.argument("repository", type=click.Path(exists=True, file_okay=False, path_type=Path))
@flag_options(TRITON_FLAGS)
@click.pass_context
def triton(ctx: click.Context, /, repository: Path, **_: Any) -> int:
    """Run tritonserver on REPOSITORY (e.g. one `clip-gateway render` wrote) in the foreground,
    on loopback ports, until Ctrl-C."""
    launch = resolve(ctx, TRITON_FLAGS).launch
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = LocalTriton(
        repository.resolve(),
        grpc_port=launch.triton_grpc_port,
        http_port=launch.triton_http_port,
        metrics_port=launch.triton_metrics_port,
    )
    with server:
        click.echo(f"tritonserver ready: grpc {server.grpc_url}, http {server.http_url}, "
                   f"metrics {server.metrics_url}")  # fmt: skip
        sys.stdout.flush()
        with contextlib.suppress(KeyboardInterrupt):
            while server.process is not None and server.process.poll() is None:
                time.sleep(0.5)
    return Exit.OK
