"""``python -m bench STUDY [ARGS]``: the one way to start a study (bench/README.md has the table:
each study's command, results folder, doc section and whether it is live or concluded).

``run`` puts our gateway beside the report's baselines; ``overload`` drives the real stack at
2x its capacity; ``soak`` holds steady load and watches the gateway's resources; ``tracing``
measures what OpenTelemetry costs at 0% and 100% sampling; ``footprint`` reads the memory of
every process the real launch path starts; ``stops`` times SIGTERM → exit in every phase;
``texts`` measures text and mixed requests; ``peers`` puts Infinity beside the cpu, cpu-int8 and
cpu-bf16 profiles with the machine's GEMM ceilings; ``quantization`` measures the INT8 methods
(dynamic, static); ``plans`` the core plans; ``cost`` the gateway's CPU time per image against
decode-only; ``host`` one GPU host end to end (the CPU wall, the engine through Triton, the
ceilings beside it); ``immich`` Immich-shaped load on ``/predict`` beside ``/v1/embeddings``;
``fidelity`` each CPU profile's served embeddings against open_clip FP32 on real photographs.
The studies after them parse their own arguments (``python -m bench STUDY --help``).

Nothing here imports a study until it runs: the parser is read without torch, and
``cpu-instances`` and ``openvino-eval`` run in virtualenvs that have numpy and their runtimes
only (run from the repository's root, ``python -m`` finds bench there).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.studies.suites import SUITES

#: Studies that parse their own arguments: ``python -m bench STUDY ARGS`` hands ARGS to the
#: module's ``main(argv)``. Subcommand -> (module of bench.studies, what it measures).
OWN_ARGUMENTS = {
    "attacks": ("attacks", "issue 23's hostile classes, alone and beside normal clients"),
    "decode-factors": ("decode_factors", "decode CPU per pixel and byte, per format (admission)"),
    "url-cache": ("url_cache", "upload vs URL item vs cache hit (in a loopback-only namespace)"),
    "pillow-compare": (
        "pillow_compare",
        "preprocess() per CPU-second, pillow-simd vs stock Pillow",
    ),
    "image-budget": ("image_budget", "the runtime image's size over its base (make image-test)"),
    "rolling-restart": ("rolling_restart", "deploy/compose under load, one gateway restarted"),
    "cpu-instances": ("cpu_instances", "the CPU profiles' model plans alone (in .triton-env)"),
    "openvino-eval": ("openvino_eval", "OpenVINO beside ONNX Runtime on the image graph"),
    "bulk": ("bulk", "the bulk job on a local Ray beside `clip-gateway embed`: rate and CPU"),
    "graph-resize": ("graph_resize", "the compact JPEGs' resize in the graph vs on the CPU"),
}

RESULTS = Path(__file__).resolve().parent / "results"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="every system beside the baselines, one report")
    run.add_argument("--suite", choices=sorted(SUITES), default="quick")
    run.add_argument("--out", type=Path, default=None, help="default: bench/results/<suite>")
    run.add_argument(
        "--profile",
        choices=("cpu", "cpu-int8", "cpu-bf16", "cpu-int8-openvino", "cuda", "tensorrt"),
        default="cpu",
        help="Triton profile for B and C (GPU profiles need the NGC tritonserver)",
    )
    for name, default_minutes, what in (
        ("overload", 4.0, "the real stack at 1x then 2x its capacity"),
        ("soak", 10.0, "steady load for minutes: memory, descriptors, threads"),
        ("tracing", 3.0, "what OpenTelemetry costs, off and on at 0%% and 100%% sampling"),
        ("footprint", 1.0, "the memory of every process the launch path starts"),
    ):
        command = commands.add_parser(name, help=what)
        command.add_argument("--minutes", type=float, default=default_minutes)
        command.add_argument("--smoke", action="store_true", help="seconds, for CI")
        command.add_argument("--out", type=Path, default=None)
        if name == "overload":
            command.add_argument(
                "--photos", choices=("compact", "camera"), default="compact",
                help="compact JPEGs, one per request, or 8-24 MP camera photos, four",
            )  # fmt: skip
    texts = commands.add_parser("texts", help="text and mixed requests through the real stack")
    texts.add_argument("--seconds", type=float, default=20.0, help="per cell and concurrency")
    texts.add_argument("--smoke", action="store_true", help="seconds, for CI")
    texts.add_argument("--out", type=Path, default=None)
    peers = commands.add_parser("peers", help="Infinity beside auto and every CPU profile")
    peers.add_argument("--smoke", action="store_true", help="one request per cell, for a check")
    peers.add_argument("--systems", nargs="+", default=None, help="default: all (SYSTEMS)")
    peers.add_argument(
        "--cells",
        nargs="+",
        default=None,
        metavar="bBxcC",
        help="only these cells, e.g. b1xc1 b32xc4 (default: all six)",
    )
    peers.add_argument("--quiet-wait", type=float, default=None, metavar="S",
                       help="wait at most S s for a quiet machine before each system "
                       "(default 600); gateway-PROFILE@IxT: a fixed plan")  # fmt: skip
    peers.add_argument("--out", type=Path, default=None)
    quantization = commands.add_parser(
        "quantization", help="ONNX Runtime's INT8 methods on both towers"
    )
    quantization.add_argument("--reps", type=int, default=5)
    quantization.add_argument("--out", type=Path, default=None)
    fidelity = commands.add_parser(
        "fidelity", help="each CPU profile vs open_clip FP32 on real photographs"
    )
    fidelity.add_argument("--profiles", nargs="+", default=None, help="default: auto and each")
    fidelity.add_argument("--photos", type=Path, default=None, help="a folder of your photos")
    fidelity.add_argument("--out", type=Path, default=None)
    plans = commands.add_parser("plans", help="core plans on the CPU profiles")
    plans.add_argument("--profiles", nargs="+", default=["cpu-int8", "cpu"])
    plans.add_argument("--out", type=Path, default=None)
    gpu = commands.add_parser("gpu", help="the exported graphs on a GPU (needs onnxruntime-gpu)")
    gpu.add_argument("--models", nargs="+", default=["ViT-B-32", "ViT-B-16"])
    gpu.add_argument("--seconds", type=float, default=2.0, help="per batch size")
    gpu.add_argument("--cache-dir", type=Path, default=Path("/tmp/clip-gateway-gpu"))
    gpu.add_argument("--cpu-dry-run", action="store_true", help="CPU EP: try the script here")
    gpu.add_argument("--out", type=Path, default=None)
    host = commands.add_parser("host", help="one GPU host end to end")
    host.add_argument("--smoke", action="store_true", help="a small sweep: CI's rehearsal")
    host.add_argument(
        "--provider", choices=("auto", "cuda", "cpu"), default="auto",
        help="auto: cuda where ONNX Runtime has its CUDA EP and a GPU answers, else cpu",
    )  # fmt: skip
    host.add_argument("--phases", nargs="+", default=["wall", "engine", "ceilings"],
                      choices=("wall", "engine", "ceilings"))  # fmt: skip
    host.add_argument("--models", nargs="+", default=None, help="default: the sweep's")
    host.add_argument("--batches", nargs="+", type=int, default=None, help="default: the sweep's")
    host.add_argument("--clients", nargs="+", type=int, default=None, help="default: the sweep's")
    host.add_argument(
        "--workers", type=int, default=0, help="the engine phase's gateway workers (0: core plan)"
    )
    host.add_argument("--decode-threads", type=int, default=0, help="per worker (0: core plan)")
    host.add_argument("--cache-dir", type=Path, default=None, help="default: the export cache")
    host.add_argument("--out", type=Path, default=None)
    stops = commands.add_parser("stops", help="SIGTERM -> exit in every phase of the entrypoint")
    stops.add_argument("--rounds", type=int, default=3)
    stops.add_argument("--out", type=Path, default=None)
    immich = commands.add_parser(
        "immich", help="Immich-shaped load on /predict beside /v1/embeddings"
    )
    immich.add_argument("--seconds", type=float, default=20.0, help="per route and concurrency")
    immich.add_argument("--smoke", action="store_true", help="seconds, for CI")
    immich.add_argument("--out", type=Path, default=None)
    cost = commands.add_parser("cost", help="the gateway's CPU per image vs decode-only")
    cost.add_argument("--smoke", action="store_true", help="a few requests; fails on a regression")
    cost.add_argument("--out", type=Path, default=None)
    for name, (_, what) in OWN_ARGUMENTS.items():
        own = commands.add_parser(name, help=what, add_help=False)
        own.add_argument("args", nargs=argparse.REMAINDER, help="the study's own (its --help)")
    return parser


def _cost(args: argparse.Namespace) -> int:
    from bench.studies import cost as cpu_cost

    out = args.out or RESULTS / ("cost-smoke" if args.smoke else "cost")
    measured = cpu_cost.run(out, args.smoke)
    print(out, flush=True)
    failure = cpu_cost.smoke_verdict(measured)
    if failure:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failure else 0


def _host(args: argparse.Namespace) -> int:
    import dataclasses

    from bench.studies import host

    gpu = args.provider == "cuda" or (args.provider == "auto" and host.has_gpu())
    sweep = host.SMOKE if args.smoke else host.FULL
    for name, value in (("models", args.models), ("batches", args.batches),
                        ("concurrency", args.clients)):  # fmt: skip
        if value:
            chosen: dict[str, Any] = {name: tuple(value)}
            sweep = dataclasses.replace(sweep, **chosen)
    sweep = dataclasses.replace(
        sweep, workers_engine=args.workers, threads_engine=args.decode_threads
    )
    out = args.out or RESULTS / ("host-smoke" if args.smoke else "host")
    results = host.run(sweep, out, args.cache_dir, gpu, tuple(args.phases))
    print(out, flush=True)
    failed = [key for key, found in results.items() if isinstance(found, dict) and "error" in found]
    if failed:
        print(f"error: phases failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


def _stops(args: argparse.Namespace) -> int:
    from bench.studies import stops as stop_times

    stop_times.run(args.rounds, args.out or RESULTS / "stops")
    return 0


def _gpu(args: argparse.Namespace) -> int:
    from bench.studies import gpu as gpu_bench

    if args.cpu_dry_run:
        gpu_bench.PROVIDER = "CPUExecutionProvider"
        gpu_bench.IMAGE_BATCHES = gpu_bench.TEXT_BATCHES = (1, 2)
    out = args.out or RESULTS / ("gpu-dry-run" if args.cpu_dry_run else "gpu")
    gpu_bench.run(tuple(args.models), out, args.cache_dir, args.seconds)
    print(out, flush=True)
    return 0


def _texts(args: argparse.Namespace) -> int:
    from bench.studies import texts as text_bench

    out = args.out or RESULTS / ("texts-smoke" if args.smoke else "texts")
    found = text_bench.run(args.seconds, out, args.smoke)
    print(out, flush=True)
    return 1 if found["wrong"] or found["unexpected_5xx"] else 0


def _immich(args: argparse.Namespace) -> int:
    from bench.studies import immich as immich_bench

    out = args.out or RESULTS / ("immich-smoke" if args.smoke else "immich")
    found = immich_bench.run(args.seconds, out, args.smoke)
    print(out, flush=True)
    return 1 if found["wrong"] or found["unexpected_5xx"] else 0


def _peers(args: argparse.Namespace) -> int:
    from bench.harness import systems
    from bench.studies import peers as peer_bench

    limits = systems.SMOKE if args.smoke else systems.FULL
    if args.quiet_wait is not None:
        limits = dataclasses.replace(limits, quiet_wait_s=args.quiet_wait)
    out = args.out or RESULTS / ("peers-smoke" if args.smoke else "peers")
    cells = tuple(c for c in systems.CELLS
                  if args.cells is None or systems.cell_name(*c) in args.cells)  # fmt: skip
    peer_bench.run(out, limits, tuple(args.systems or peer_bench.SYSTEMS), cells)
    print(out, flush=True)
    return 0


def _quantization(args: argparse.Namespace) -> int:
    from bench.studies import quantization as int8_methods

    int8_methods.run(args.out or RESULTS / "int8", args.reps)
    return 0


def _fidelity(args: argparse.Namespace) -> int:
    from bench.studies import fidelity

    out = args.out or RESULTS / "fidelity"
    found = fidelity.run(out, tuple(args.profiles or fidelity.PROFILES), args.photos)
    print(out, flush=True)
    return 0 if all("error" not in p for p in found["profiles"].values()) else 1


def _plans(args: argparse.Namespace) -> int:
    from bench.studies import plans as core_plans

    core_plans.run(args.out or RESULTS / "plans", profiles=tuple(args.profiles))
    return 0


def _run(args: argparse.Namespace) -> int:
    from bench.studies import runner

    runner.run(args.suite, args.out or RESULTS / args.suite, args.profile)
    return 0


def _timed(args: argparse.Namespace) -> int:
    """overload · soak · tracing · footprint: minutes of load, then a verdict on the answers."""
    from bench.studies import footprint, overload, soak, tracing_cost

    modules = {"overload": overload, "soak": soak, "tracing": tracing_cost, "footprint": footprint}
    module = modules[args.command]
    suffix = "-smoke" if args.smoke else ""
    extra = {}
    if args.command == "overload":
        extra["photos"] = args.photos
        suffix = ("-camera" if args.photos == "camera" else "") + suffix
    out = args.out or RESULTS / f"{args.command}{suffix}"
    results = module.run(args.minutes, out, args.smoke, **extra)
    print(out, flush=True)
    return 1 if results.get("wrong") or results.get("unexpected_5xx") else 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "cost": _cost,
    "stops": _stops,
    "gpu": _gpu,
    "host": _host,
    "texts": _texts,
    "immich": _immich,
    "peers": _peers,
    "quantization": _quantization,
    "plans": _plans,
    "fidelity": _fidelity,
    "run": _run,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in OWN_ARGUMENTS:
        import importlib

        study = importlib.import_module(f"bench.studies.{OWN_ARGUMENTS[argv[0]][0]}")
        status: int = study.main(argv[1:])
        return status
    args = _parser().parse_args(argv)
    return COMMANDS.get(args.command, _timed)(args)


if __name__ == "__main__":
    sys.exit(main())
