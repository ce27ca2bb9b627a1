"""``clip-gateway``: a photo library in three commands: ``serve``, ``embed DIR``, ``dupes``."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from gateway.client import Client, CompactOptions
from gateway.client.dupes import groups
from gateway.client.library import Library, photos, sha256


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clip-gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    embed = commands.add_parser("embed", help="embed every JPEG/PNG/WebP under DIR (resumable)")
    embed.add_argument("directory", type=Path)
    embed.add_argument("--out", type=Path, required=True, help="the .npz to create or extend")
    embed.add_argument("--url", default="http://127.0.0.1:8000")
    embed.add_argument("--api-key", default=None)
    embed.add_argument("--batch-size", type=int, default=32)
    embed.add_argument("--concurrency", type=int, default=4)
    embed.add_argument("--no-shrink", action="store_true", help="upload originals")
    embed.add_argument(
        "--checkpoint-every", type=int, default=512, help="images between saves of --out"
    )
    dupes = commands.add_parser("dupes", help="group near-duplicates in an embeddings file")
    dupes.add_argument("file", type=Path)
    dupes.add_argument("--threshold", type=float, default=0.95)
    dupes.add_argument("--html", type=Path, default=None, help="write a review page")
    dupes.add_argument("--block", type=int, default=4096, help="rows per similarity tile")
    commands.add_parser(
        "serve",
        help="what `make serve` runs: export if needed, Triton + gateway (see serve --help); "
        "needs the server extra",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    args = parse_args(argv)
    if args.command == "embed":
        return embed(args)
    return find_dupes(args)


def serve(argv: list[str]) -> int:
    try:
        from gateway.runtime.supervisor import serve as run
    except ImportError as exc:
        print(
            f"clip-gateway serve needs the server extra ({exc.name} is missing): "
            "pip install 'clip-gateway[server]'",
            file=sys.stderr,
        )
        return 2
    return run(argv)


def embed(args: argparse.Namespace) -> int:
    library = Library.load(args.out)
    known, recorded = library.known(), set(library.paths)
    files = [p for p in photos(args.directory) if str(p) not in recorded]
    print(f"{len(recorded)} already in {args.out}; {len(files)} files to look at", flush=True)
    client = Client(
        args.url,
        api_key=args.api_key,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        compact=CompactOptions(enabled=not args.no_shrink),
    )
    new = reused = 0
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} img/s"),
        TimeRemainingColumn(),
    )
    try:
        with client, ThreadPoolExecutor(4) as hashing, Progress(*columns) as progress:
            task = progress.add_task("embedding", total=len(files), rate="-")
            for start in range(0, len(files), args.checkpoint_every):
                chunk = files[start : start + args.checkpoint_every]
                digests = list(hashing.map(sha256, chunk))
                todo = {d: p for p, d in zip(chunk, digests, strict=True) if d not in known}
                if todo:
                    vectors = client.embed(list(todo.values()))
                    known.update(zip(todo, vectors, strict=True))
                for path, digest in zip(chunk, digests, strict=True):
                    library.add(str(path), digest, known[digest])
                new, reused = new + len(todo), reused + len(chunk) - len(todo)
                library.save(args.out)  # checkpoint: an interrupted run keeps all of this
                progress.update(task, advance=len(chunk))
                speed = progress.tasks[task].speed
                progress.update(task, rate=f"{speed:.1f}" if speed else "-")
    except KeyboardInterrupt:
        print(f"interrupted: {len(library.paths)} saved in {args.out}; run again to resume")
        return 130
    print(f"embedded {new} new, reused {reused} (same content), {len(library.paths)} in {args.out}")
    return 0


def find_dupes(args: argparse.Namespace) -> int:
    library = Library.load(args.file)
    vectors = library.embeddings()
    found = groups(vectors, args.threshold, args.block) if len(vectors) else []
    for number, members in enumerate(found, 1):
        print(f"group {number} ({len(members)}):")
        for index in members:
            print(f"  {library.paths[index]}")
    print(f"{len(found)} groups of near-duplicates among {len(vectors)} photos "
          f"(cosine >= {args.threshold})")  # fmt: skip
    if args.html:
        from gateway.client.report import write

        write(found, library.paths, vectors, args.html)
        print(f"review page: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
