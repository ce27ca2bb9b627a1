"""``clip-gateway bulk SRC DST --gateway URL[,URL...]``: the options, the progress bars and
the summary; the job itself is job.py. Importing this module imports neither Ray nor pyarrow,
so ``clip-gateway --help`` stays quick and the client install can say what it lacks."""

from __future__ import annotations

import importlib.util
from typing import Any

import click

from clip_gateway.exits import Exit

EPILOG = (
    "\b\nExit codes:\n"
    "  0  every shard written and every input embedded\n"
    "  1  some shards not written (each is named): run the same command again to resume\n"
    "  2  bad option, or DST holds another job\n"
    "  3  every shard written; some inputs failed (DST/failures/ names each and why)\n"
    "  130  interrupted: run the same command again to resume"
)


def _gateways(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    urls = [u.strip() for v in value for u in v.split(",") if u.strip()]
    if not urls:
        raise click.BadParameter("give at least one gateway URL")
    return urls


@click.command(epilog=EPILOG)
@click.argument("src")
@click.argument("dst")
@click.option(
    "--gateway",
    "gateways",
    multiple=True,
    required=True,
    callback=_gateways,
    envvar="CLIP_GATEWAY_URL",
    show_envvar=True,
    help="Gateway URL(s), comma-separated or repeated (one URL: a Kubernetes Service).",
)
@click.option(
    "--api-key",
    envvar="CLIP_GATEWAY_API_KEY",
    show_envvar=True,
    default=None,
    help="Bearer key, for gateways that require one.  [default: none]",
)
@click.option(
    "--format",
    "source_format",
    default="auto",
    type=click.Choice(["auto", "folder", "webdataset", "parquet"]),
    help="What SRC holds; auto: tar files are webdataset shards, .parquet files "
    "Parquet, anything else a folder of images.",
)
@click.option(
    "--image-column",
    default=None,
    help="Parquet: the image bytes column "
    "[default: image, jpg, png, webp, img, image_bytes or bytes].",
)
@click.option(
    "--caption-column",
    default=None,
    help="Parquet: the caption column [default: caption, txt or text, if any].",
)
@click.option(
    "--key-column",
    default=None,
    help="Parquet: the key column [default: key, __key__ or id, else the row number].",
)
@click.option(
    "--captions/--no-captions",
    default=True,
    help="Embed captions too (text_emb/), when the source has them.",
)
@click.option(
    "--dtype",
    type=click.Choice(["float16", "float32"]),
    default="float16",
    help="The embeddings' type on disk (clip-retrieval writes float16).",
)
@click.option("--batch-size", type=click.IntRange(1, 256), default=32, help="Images per request.")
@click.option(
    "--in-flight",
    type=click.IntRange(1),
    default=8,
    help="Requests in flight per gateway, the whole job (shared by the workers; each "
    "has at least one). docs/BULK.md says how to size it.",
)
@click.option("--workers", type=click.IntRange(1), default=2, help="Ray workers (actors).")
@click.option(
    "--worker-cpus",
    type=click.FloatRange(0.1),
    default=1.0,
    help="CPUs each worker reserves on the Ray cluster.",
)
@click.option(
    "--shard-size",
    type=click.IntRange(1),
    default=10_000,
    help="Folders and Parquet: inputs per output shard (a tar file is one shard).",
)
@click.option(
    "--no-shrink",
    is_flag=True,
    show_default="off",
    help="Send the original bytes instead of the SDK's compact JPEGs.",
)
@click.option(
    "--give-up-s",
    type=click.FloatRange(1),
    default=600.0,
    help="How long every gateway may be out of service before a shard is left for the next run.",
)
@click.option(
    "--ray-address",
    default=None,
    envvar="RAY_ADDRESS",
    show_envvar=True,
    help="Join this Ray cluster instead of starting a local one.  [default: local]",
)
@click.option(
    "--num-cpus", type=click.IntRange(1), default=None, help="A local Ray's CPUs.  [default: all]"
)
@click.option(
    "--object-store-mb",
    type=click.IntRange(64),
    default=None,
    help="A local Ray's object store.  [default: Ray's]",
)
def bulk(src: str, dst: str, gateways: list[str], **options: Any) -> int:
    """Embed every image under SRC (a folder, webdataset tar shards or Parquet files; a path
    or s3://...) through the gateways into DST, as clip-retrieval's inference writes it:
    img_emb/, text_emb/, metadata/ (autofaiss indexes img_emb/ as it is), and failures/.

    Resumable: a run that is stopped, killed or loses its gateways is started again with the
    same command, and every input ends in exactly one row or one failure; a run over a
    finished DST does nothing.
    """
    if any(importlib.util.find_spec(name) is None for name in ("ray", "pyarrow", "aiohttp")):
        click.echo(
            "clip-gateway: bulk needs the bulk extra: pip install 'clip-gateway[bulk]'", err=True
        )
        return Exit.USAGE
    from clip_gateway.bulk.console import run_bulk

    return run_bulk(src, dst, gateways, options)
