"""The client's ``clip-gateway`` commands: ``embed`` a photo folder into a library file,
``search`` it with words or a photo, review its near-``dupes``: their options and help here,
what each does in commands.py. The root command that mounts them beside the server's is
clip_gateway/cli/main.py.

Results go to stdout, progress and notes to stderr. The exit codes (clip_gateway/exits.py) are the
same in every command and listed in ``--help``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx

from clip_gateway.client.core import ClientError
from clip_gateway.exits import EXIT_CODES, Exit

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_URL = "http://127.0.0.1:8000"


def url_option(command: F) -> F:
    return click.option(
        "--url",
        envvar="CLIP_GATEWAY_URL",
        show_envvar=True,
        default=DEFAULT_URL,
        help="The gateway's base URL.",
    )(command)


def api_key_option(command: F) -> F:
    return click.option(
        "--api-key",
        envvar="CLIP_GATEWAY_API_KEY",
        show_envvar=True,
        default=None,
        help="Bearer key, for a gateway that requires one.  [default: none]",
    )(command)


def library_argument(command: F) -> F:
    kind = click.Path(exists=True, dir_okay=False, path_type=Path)
    return click.argument("library", type=kind)(command)


def guarded(command: F) -> F:
    """Turn what can go wrong talking to the gateway into a message and an exit code."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> int:
        url = kwargs.get("url", DEFAULT_URL)
        try:
            return int(command(*args, **kwargs))
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            _error(f"could not reach the gateway at {url}: {reason}; is it running?")
            return Exit.UNREACHABLE
        except ClientError as exc:
            hint = " (--api-key or CLIP_GATEWAY_API_KEY)" if exc.status == 401 else ""
            _error(f"the gateway at {url} refused the request: {exc}{hint}")
            return Exit.REFUSED
        except KeyboardInterrupt:
            _error("interrupted")
            return Exit.INTERRUPTED

    return run  # type: ignore[return-value]


def _error(message: str) -> None:
    click.echo(f"clip-gateway: {message}", err=True)


@click.command(epilog=EXIT_CODES)
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The library file (.npz) to create, or to bring up to date.",
)
@url_option
@api_key_option
@click.option("--batch-size", type=click.IntRange(1, 256), default=32, help="Photos per request.")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, help="Requests at once.")
@click.option(
    "--no-shrink",
    is_flag=True,
    show_default="off",
    help="Upload the original files instead of compact JPEGs sized for the model (HEIC, AVIF "
    "and GIF are converted to JPEG either way: the gateway does not read them).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(1),
    default=512,
    help="Files between saves of --out (Ctrl-C keeps the last save).",
)
@click.option(
    "--retry-failed",
    is_flag=True,
    show_default="off",
    help="Try again the files that failed before, even when unchanged.",
)
@click.option(
    "--hidden",
    is_flag=True,
    show_default="off",
    help="Include hidden files and folders (names with a leading dot).",
)
@guarded
def embed(directory: Path, out: Path, url: str, api_key: str | None, **options: Any) -> int:
    """Embed every photo under DIRECTORY into a library file, resumably.

    Photos are found by content (JPEG, PNG, WebP, GIF, HEIC/HEIF, AVIF), in every subfolder.
    A file whose path, size and time are unchanged is not read again; one whose content is
    already in the library (a copy, a rename) reuses its embedding. A file that cannot be
    embedded is named with the reason, recorded, and not tried again while unchanged.
    """
    from clip_gateway.photos.commands import run_embed

    return run_embed(directory, out, url, api_key, options)


@click.command(epilog=EXIT_CODES)
@library_argument
@click.argument("query", required=False)
@click.option(
    "--image",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Search by example: the photos most like this one (instead of QUERY).  [default: none]",
)
@click.option("--top", type=click.IntRange(1), default=10, help="Number of results.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    show_default="off",
    help="Print JSON for scripts (rank, score, path per result) instead of lines.",
)
@click.option(
    "--html",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a page of the results' thumbnails with scores.  [default: none]",
)
@url_option
@api_key_option
@guarded
def search(library: Path, query: str | None, image: Path | None, **options: Any) -> int:
    """Rank the photos of LIBRARY by how well they match QUERY (words, embedded by the gateway)
    or --image; print rank, score (cosine similarity) and path, best first."""
    from clip_gateway.photos.commands import run_search

    if (query is None) == (image is None):
        raise click.UsageError("give either QUERY or --image PATH")
    return run_search(library, query, image, options)


@click.command()
@library_argument
@click.option(
    "--threshold",
    type=click.FloatRange(-1.0, 1.0),
    default=0.95,
    help="Cosine similarity from which two photos count as near-duplicates.",
)
@click.option(
    "--html",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a review page: thumbnails, size, date, the one to keep.  [default: none]",
)
@click.option(
    "--block", type=click.IntRange(1), default=4096, help="Rows per similarity tile (memory)."
)
def dupes(library: Path, threshold: float, html: Path | None, block: int) -> int:
    """Group the near-duplicate photos of LIBRARY and mark the one to keep in each group."""
    from clip_gateway.photos.commands import run_dupes

    return run_dupes(library, threshold, html, block)
