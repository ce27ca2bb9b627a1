"""``clip-gateway``: the client's commands (``embed``, ``search``, ``dupes``:
clip_gateway/photos/cli.py; ``bulk``: clip_gateway/bulk/cli.py) and the server's (``serve`` and
the maintenance commands: serve.py, tools.py) under one root.

The server's commands are imported only when named, so the client install (``pip install
clip-gateway``, no server extra) runs its own commands and answers a server command with the
extra it needs. No command ever ends in a traceback (``CLIP_GATEWAY_DEBUG=1`` shows one for an
unexpected error); the exit codes (``Exit``) are listed in ``--help``.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import traceback
from importlib import metadata

import click

from clip_gateway.exits import EXIT_CODES, Exit

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 100}
#: The client's commands (the base install): name -> module:attribute.
CLIENT_COMMANDS = {
    "embed": "clip_gateway.photos.cli:embed",
    "search": "clip_gateway.photos.cli:search",
    "dupes": "clip_gateway.photos.cli:dupes",
    # the bulk extra's job; the command itself imports neither Ray nor pyarrow, and says so
    # when they are missing
    "bulk": "clip_gateway.bulk.cli:bulk",
}
#: The server's commands: name -> (module:attribute, the one line ``--help`` shows for it).
SERVER_COMMANDS = {
    "serve": ("clip_gateway.cli.serve:serve", "Run the gateway: Triton and the HTTP server."),
    "config": ("clip_gateway.cli.tools:config", "Print every setting: flag, env var, default."),
    "timings": (
        "clip_gateway.cli.tools:timings",
        "Print the stop and start-up bounds derived here.",
    ),
    "render": ("clip_gateway.cli.tools:render", "Render the Triton model repository of an export."),
    "triton": ("clip_gateway.cli.tools:triton", "Run tritonserver on a model repository."),
    "imaging": ("clip_gateway.cli.imaging:imaging", "Print the image decode and resize libraries."),
}


def _version() -> str:
    try:
        return metadata.version("clip-gateway")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


class Root(click.Group):
    """Every command imported only when named: ``clip-gateway imaging`` (the install's check)
    imports no more than it needs, and the client install lacks the server's modules."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*CLIENT_COMMANDS, *SERVER_COMMANDS]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in CLIENT_COMMANDS:
            return _load(CLIENT_COMMANDS[cmd_name])
        if cmd_name not in SERVER_COMMANDS:
            return None
        where, summary = SERVER_COMMANDS[cmd_name]
        try:
            command = _load(where)
        except ImportError as exc:  # the client install: no server extra
            return _needs_the_server_extra(cmd_name, summary, exc.name or str(exc))
        command.short_help = summary
        return command


def _load(where: str) -> click.Command:
    module, attribute = where.split(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command), where
    return command


def _needs_the_server_extra(name: str, summary: str, missing: str) -> click.Command:
    message = (
        f"{name} needs the server extra ({missing} is missing): pip install 'clip-gateway[server]'"
    )

    def refuse() -> int:
        click.echo(f"clip-gateway: {message}", err=True)
        return Exit.USAGE

    return click.Command(
        name,
        callback=refuse,
        help=message,
        short_help=f"{summary} (needs the server extra)",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )


@click.group(cls=Root, context_settings=CONTEXT, epilog=EXIT_CODES)
@click.version_option(_version(), "--version", prog_name="clip-gateway")
def cli() -> None:
    """Embed a photo folder through a clip-gateway, search it with words or a photo, and
    review its near-duplicates; embed a whole collection on Ray through a fleet of gateways
    (bulk); run the gateway itself (serve) and its maintenance commands."""


def main(argv: list[str] | None = None) -> int:
    """The ``clip-gateway`` command: its exit code, never a traceback. Interrupted, it exits at
    once: a request still in flight in a worker thread is abandoned, not waited for (Python
    would join that thread at exit, for as long as the server takes to answer)."""
    code = _main(argv)
    main_thread = threading.main_thread()
    if code == Exit.INTERRUPTED and any(
        t is not main_thread and t.is_alive() and not t.daemon for t in threading.enumerate()
    ):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    try:
        result = cli.main(argv, prog_name="clip-gateway", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:  # --help, --version
        return int(exc.exit_code)
    except click.Abort:
        click.echo("clip-gateway: interrupted", err=True)
        return Exit.INTERRUPTED
    except Exception as exc:
        if os.environ.get("CLIP_GATEWAY_DEBUG"):
            traceback.print_exc()
        click.echo(f"clip-gateway: unexpected error: {type(exc).__name__}: {exc}", err=True)
        return Exit.ERROR
    return int(result or 0)
