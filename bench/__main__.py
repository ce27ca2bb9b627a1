"""``python -m bench STUDY [ARGS]``: the one way to start a study. Each is a module of
bench/studies whose ``main(argv)`` parses ARGS (``python -m bench STUDY --help``); bench/README.md
has the table: each study's command, results folder and doc section.

Concluded studies left the live tree; their code is at commit ``c84860a``
(bench/README.md "Concluded studies"). Nothing here imports a study until it runs: the parser
is read without torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommand -> (module of bench.studies, what it measures).
STUDIES = {
    "cost": ("cost", "the gateway's CPU per image vs decode-only (CI: --smoke)"),
    "peers": ("peers", "Infinity beside auto and every CPU profile"),
    "host": ("host", "one GPU host end to end (the GPU kit; CI: --smoke)"),
    "decode-factors": ("decode_factors", "decode CPU per pixel and byte, per format (admission)"),
    "overload": ("overload", "the real stack at 1x then 2x its capacity"),
    "soak": ("soak", "steady load for minutes: memory, descriptors, threads"),
    "tracing": ("tracing_cost", "what OpenTelemetry costs, off and on at 0%% and 100%% sampling"),
    "footprint": ("footprint", "the memory of every process the launch path starts"),
    "texts": ("texts", "text and mixed requests through the real stack"),
    "image-budget": ("image_budget", "the runtime image's size over its base (make image-test)"),
    "rolling-restart": ("rolling_restart", "deploy/compose under load, one gateway restarted"),
    "bulk": ("bulk", "the bulk job on a local Ray beside `clip-gateway embed`: rate and CPU"),
}

#: The commit that holds every concluded study's code (in every clone's history, where a tag
#: would not travel), and the studies there (subcommands).
COMMIT = "c84860a"
CONCLUDED = (
    "run", "quantization", "fidelity", "plans", "gpu", "stops", "immich", "attacks", "url-cache",
    "pillow-compare", "graph-resize", "cpu-instances", "openvino-eval",
)  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="STUDY")
    for name, (_, what) in STUDIES.items():
        study = commands.add_parser(name, help=what, add_help=False)
        study.add_argument("args", nargs=argparse.REMAINDER, help="the study's own (its --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in CONCLUDED:
        name = argv[0]
        at = COMMIT
        print(f"python -m bench {name}: a concluded study, its code at commit {at}:\n"
              f"  git checkout {at} && python -m bench {name} ...", file=sys.stderr)  # fmt: skip
        return 2
    _parser().parse_args(argv[:1])  # --help, or an unknown study: the parser says so and exits
    study = importlib.import_module(f"bench.studies.{STUDIES[argv[0]][0]}")
    status: int = study.main(argv[1:])
    return status


if __name__ == "__main__":
    sys.exit(main())
