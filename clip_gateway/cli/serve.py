"""``clip-gateway serve``: the gateway in the foreground, as ``make serve`` runs it (the server
extra): the model exported if needed, Triton, the HTTP server, all supervised by
launcher/supervisor.py, quiet on the terminal with the children's logs in a file. Its flags are
settings fields (options.py): each one's default and environment variable are declared once, in
clip_gateway/config/settings.py. ``clip-gateway config`` prints them all (docs/CONFIGURATION.md)."""

from __future__ import annotations

from typing import Any

import click

from clip_gateway.cli.options import Flag, flag_options, resolve
from clip_gateway.config.settings import Settings
from clip_gateway.exits import EXIT_CODES
from clip_gateway.launcher.supervisor import OK, Supervisor
from clip_gateway.model.spec import default_cache_dir
from clip_gateway.observability.logs import configure

#: ``serve``'s flags, each a settings field (its env var and default: ``clip-gateway config``).
SERVE_FLAGS = (
    Flag("server", "host"),
    Flag("server", "port"),
    Flag("launch", "model"),
    Flag("launch", "weights"),
    Flag("launch", "tokenizer"),
    Flag("launch", "model_dir"),
    Flag("repository", "profile"),
    Flag("launch", "cache_dir"),
    Flag("launch", "log_file"),
    Flag("server", "immich"),
    Flag("server", "immich_upstream"),
)


def supervise(settings: Settings, export_only: bool = False) -> int:
    """Run the gateway on ``settings`` until a stop (``export_only``: make the export it would
    serve, then stop): the exit code. Progress lines here, the children's logs in the log file
    (none: everything on the terminal, at INFO)."""
    log_file = settings.launch.log_file
    configure("WARNING" if log_file else "INFO", "text")
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        if not export_only:  # said once, by the serve that follows
            print(f"clip-gateway: logs in {log_file}", flush=True)

    def progress(line: str) -> None:
        print(f"clip-gateway: {line}", flush=True)

    supervisor = Supervisor(settings, progress)
    if export_only:
        return supervisor.export_only()
    code = supervisor.run()
    progress("stopped" if code == OK else f"exited with code {code}")
    return code


@click.command(epilog=EXIT_CODES)
@flag_options(SERVE_FLAGS)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    show_default="off",
    help="Triton's and the gateway's logs on the terminal instead of the log file.",
)
@click.option(
    "--export-only",
    is_flag=True,
    show_default="off",
    help="Make the export these flags would serve (if missing), then exit: make serve runs it "
    "while Triton's environment installs.",
)
@click.pass_context
def serve(ctx: click.Context, /, verbose: bool, export_only: bool, **_flags: Any) -> int:
    """Export the model if needed, start Triton and the gateway in the foreground.

    Every flag is also an environment variable (shown with it); a flag given wins over the
    variable, the variable over the default. The logs go to --log-file, else
    <cache>/logs/serve.log, unless --verbose.
    """
    settings = resolve(ctx, SERVE_FLAGS)
    launch = settings.launch
    log_file = None
    if not verbose:
        log_file = launch.log_file or (launch.cache_dir or default_cache_dir()) / "logs/serve.log"
    settings = Settings(
        settings.server, settings.repository, launch.model_copy(update={"log_file": log_file})
    )
    # what runs the settings: the supervisor; a unit test of this module passes its own
    if export_only:
        return supervise(settings, export_only=True)
    run = ctx.obj if callable(ctx.obj) else supervise
    return int(run(settings))
