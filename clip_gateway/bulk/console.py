"""What ``clip-gateway bulk`` does once its options are parsed: the job with progress bars on
stderr, then the summary; an exit code back."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from clip_gateway.bulk import sources
from clip_gateway.bulk.fleet import FleetOptions
from clip_gateway.bulk.job import PlanMismatch, RayOptions, run
from clip_gateway.bulk.work import JobSpec
from clip_gateway.exits import Exit


def spec_of(src: str, dst: str, gateways: list[str], options: dict[str, Any]) -> JobSpec:
    form = options["source_format"]
    columns = sources.Columns(
        options["image_column"], options["caption_column"], options["key_column"]
    )
    source = sources.Source(src, sources.detect(src) if form == "auto" else form, columns)
    fleet = FleetOptions(in_flight=options["in_flight"], give_up_s=options["give_up_s"])
    return JobSpec(
        source,
        dst,
        tuple(gateways),
        options["dtype"],
        options["captions"],
        options["batch_size"],
        fleet,
        not options["no_shrink"],
        options["api_key"],
    )


def run_bulk(src: str, dst: str, gateways: list[str], options: dict[str, Any]) -> int:
    try:
        spec = spec_of(src, dst, gateways, options)
    except (OSError, sources.SourceError) as exc:
        raise click.UsageError(f"cannot read {src}: {exc}") from exc
    store = options["object_store_mb"]
    ray_options = RayOptions(
        options["ray_address"],
        options["workers"],
        options["worker_cpus"],
        options["num_cpus"],
        store << 20 if store else None,
    )
    console = Console(stderr=True)
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    )
    tasks: dict[str, Any] = {}

    def update(counts: dict[str, int]) -> None:
        if not tasks:
            bars.start()
            tasks["shards"] = bars.add_task("shards", total=counts["shards_total"], note="")
            tasks["images"] = bars.add_task("images", total=None, note="")
        bars.update(tasks["shards"], completed=counts["shards"])
        note = f"{counts['failed']} failed, {counts['bytes'] / 1e6:.0f} MB read"
        bars.update(tasks["images"], completed=counts["rows"], note=note)

    try:
        # live bars only on a terminal: elsewhere (a pipe, a RayJob's log) rich draws none
        watched = update if console.is_terminal else None
        summary = run(spec, ray_options, shard_size=options["shard_size"], progress=watched)
    except PlanMismatch as exc:
        raise click.UsageError(str(exc)) from exc
    except (OSError, sources.SourceError) as exc:
        raise click.UsageError(f"cannot read {src} or write {dst}: {exc}") from exc
    finally:
        if tasks:
            bars.stop()
    for line in summary.lines():
        click.echo(line)
    if not summary.complete:
        return Exit.ERROR
    return Exit.INCOMPLETE if summary.total_failures else Exit.OK
