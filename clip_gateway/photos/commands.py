"""What each client ``clip-gateway`` command does once its options are parsed (cli.py): results to
stdout, progress and notes to stderr, an exit code back."""

from __future__ import annotations

import json
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from clip_gateway.client.compact import CompactOptions
from clip_gateway.client.core import ClientError
from clip_gateway.client.sync import Client
from clip_gateway.exits import Exit
from clip_gateway.photos.dupes import groups
from clip_gateway.photos.embed_folder import ModelMismatch, Options, embed_folder, summary
from clip_gateway.photos.facts import BEST_RULE, best, facts
from clip_gateway.photos.library import Library
from clip_gateway.photos.report import write_dupes, write_search
from clip_gateway.photos.search import rank


def _note(message: str) -> None:
    click.echo(f"clip-gateway: {message}", err=True)


def load_library(path: Path) -> Library:
    """The library at ``path``, or a usage error saying why it is not one."""
    try:
        return Library.load(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise click.UsageError(f"{path} is not a clip-gateway library ({exc})") from exc


@contextmanager
def progress_bar() -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr, as ``update(done, total)``."""
    columns = (
        TextColumn("embedding"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} img/s"),
        TimeRemainingColumn(),
    )
    bar = Progress(*columns, console=Console(stderr=True))
    tasks: list[TaskID] = []  # the bar appears with the first photo to embed
    started = time.monotonic()

    def update(done: int, total: int) -> None:
        if not tasks:
            bar.start()
            tasks.append(bar.add_task("embedding", total=total, rate="-"))
        elapsed = time.monotonic() - started
        rate = f"{done / elapsed:.1f}" if done and elapsed else "-"
        bar.update(tasks[0], completed=done, total=total, rate=rate)

    try:
        yield update
    finally:
        if tasks:
            bar.stop()


def run_embed(
    directory: Path, out: Path, url: str, api_key: str | None, options: dict[str, Any]
) -> int:
    load_library(out)  # refuse a file that is not a library before any work
    client = Client(
        url,
        api_key=api_key,
        batch_size=options["batch_size"],
        concurrency=options["concurrency"],
        compact=CompactOptions(enabled=not options["no_shrink"]),
    )
    run = Options(options["checkpoint_every"], options["retry_failed"], options["hidden"])
    click.echo(f"looking for photos in {directory}", err=True)
    try:
        with client, progress_bar() as update:
            library, report = embed_folder(directory, out, client, run, update)
    except ModelMismatch as exc:
        raise click.UsageError(f"{exc}; write to another --out") from exc
    except (httpx.TransportError, ClientError, KeyboardInterrupt):
        if out.exists():
            _note(f"stopped; {out} keeps what was saved")
        raise
    for line in summary(report, library, out):
        click.echo(line)
    return Exit.OK if report.complete else Exit.INCOMPLETE


def run_search(
    library_path: Path, query: str | None, image: Path | None, options: dict[str, Any]
) -> int:
    library = load_library(library_path)
    url = options["url"]
    with Client(url, api_key=options["api_key"]) as client:
        client.model_info()  # fails at once when unreachable or the key is refused
        if query is not None:
            click.echo(f"embedding the query at {url}", err=True)
            try:
                vector = client.embed_texts([query])[0]
            except ClientError as exc:
                if exc.status in (400, 415, 422):  # a gateway without text embeddings says so
                    _note("the gateway could not embed the text; does it serve text embeddings?")
                raise
        else:
            assert image is not None
            click.echo(f"embedding {image} at {url}", err=True)
            answer = client.embed_valid([image])
            if answer.errors:
                raise click.UsageError(f"cannot search by {image}: {answer.errors[0]}")
            vector = answer.vectors[0]
    hits = rank(library.embeddings(), library.paths, vector, options["top"])
    if options["as_json"]:
        click.echo(json.dumps([asdict(hit) for hit in hits], indent=1))
    else:
        for hit in hits:
            click.echo(f"{hit.rank:>3}  {hit.score:.4f}  {hit.path}")
    click.echo(f"{len(hits)} of {len(library.paths)} photos in {library_path}", err=True)
    if options["html"]:
        label = query if query is not None else f"photos like {image}"
        write_search(label, hits, len(library.paths), options["html"])
        click.echo(f"results page: {options['html']}", err=True)
    return Exit.OK


def run_dupes(library_path: Path, threshold: float, html: Path | None, block: int) -> int:
    library = load_library(library_path)
    vectors = library.embeddings()
    found = groups(vectors, threshold, block) if len(vectors) else []
    described = []
    for number, members in enumerate(found, 1):
        known = [facts(library.paths[i]) for i in members]
        keep = best(known)
        described.append(known)
        click.echo(f"group {number} ({len(members)} photos):")
        for position, index in enumerate(members):
            click.echo(f"  {'keep ' if position == keep else 'other'}  {library.paths[index]}")
    click.echo(
        f"{len(found)} groups of near-duplicates among {len(vectors)} photos "
        f"(cosine >= {threshold:g}); keep = {BEST_RULE}"
    )
    if html:
        write_dupes(found, described, library.paths, vectors, threshold, html)
        click.echo(f"review page: {html}", err=True)
    return Exit.OK
