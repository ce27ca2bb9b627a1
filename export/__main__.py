"""`python -m export`: an OpenCLIP model's image and text towers to ONNX (FP32 + FP16), its
tokenizer and preprocessing into the manifest; cached, parity-checked."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path

from export.build import ensure_exported
from export.spec import (
    DEFAULT_MODEL,
    DEFAULT_PRETRAINED,
    UnsupportedModelError,
    Weights,
    WeightsUnavailableError,
    default_cache_dir,
    weights_from_spec,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="open_clip model name")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--pretrained",
        default=None,
        help=f"open_clip pretrained tag (default {DEFAULT_PRETRAINED})",
    )
    source.add_argument("--checkpoint", type=Path, help="local open_clip checkpoint file")
    source.add_argument(
        "--random-init", action="store_true", help="random weights (tests and benchmarks only)"
    )
    source.add_argument("--weights", help="one spec: random[:SEED] | PATH | TAG")
    parser.add_argument("--seed", type=int, default=0, help="seed for --random-init")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="default: " + str(default_cache_dir())
    )
    parser.add_argument("--no-fp16", action="store_true", help="skip the FP16 variant")
    parser.add_argument("--force", action="store_true", help="re-export even if cached")
    parser.add_argument("--print-dir", action="store_true", help="print only the export directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.weights:
        weights = weights_from_spec(args.weights)
    elif args.random_init:
        weights = Weights.random(args.seed)
    elif args.checkpoint:
        weights = Weights.checkpoint(args.checkpoint)
    else:
        weights = Weights.pretrained(args.pretrained or DEFAULT_PRETRAINED)
    try:
        # torch.onnx reports progress with print(): keep stdout for the answer (--print-dir is
        # read by scripts, e.g. the Dockerfile)
        with contextlib.redirect_stdout(sys.stderr):
            exported = ensure_exported(
                args.model, weights, args.cache_dir, fp16=not args.no_fp16, force=args.force
            )
    except (WeightsUnavailableError, UnsupportedModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_dir:
        print(exported.directory)
    else:
        print(json.dumps({"directory": str(exported.directory)} | exported.manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
