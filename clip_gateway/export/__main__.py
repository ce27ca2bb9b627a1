"""`python -m clip_gateway.export`: an OpenCLIP model's image and text towers to ONNX (FP32 + FP16),
its tokenizer and preprocessing into the manifest; cached, parity-checked."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path

from clip_gateway.export.build import ensure_exported
from clip_gateway.model import gate
from clip_gateway.model.spec import (
    DEFAULT_MODEL,
    DEFAULT_PRETRAINED,
    UnsupportedModelError,
    Weights,
    WeightsUnavailableError,
    default_cache_dir,
    weights_from_spec,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m clip_gateway.export", description=__doc__)
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
    parser.add_argument(
        "--tokenizer", type=Path, default=None,
        help="a directory with the model's Hugging Face tokenizer files (tokenizer.json, "
        "tokenizer_config.json, ...), for SigLIP, SigLIP2 and multilingual models "
        "(default: $CLIP_TOKENIZER, else the Hugging Face hub)",
    )  # fmt: skip
    parser.add_argument("--no-fp16", action="store_true", help="skip the FP16 variant")
    parser.add_argument("--force", action="store_true", help="re-export even if cached")
    parser.add_argument("--print-dir", action="store_true", help="print only the export directory")
    parser.add_argument(
        "--int8", action="store_true",
        help="also quantize both towers to INT8 (the cpu-int8 profile) and run the quality gate",
    )  # fmt: skip
    parser.add_argument(
        "--int8-min-mean-cosine", type=float, default=gate.MIN_MEAN_COSINE,
        help="the gate: mean cosine INT8 vs FP32 per tower on the calibration set",
    )  # fmt: skip
    parser.add_argument(
        "--int8-min-cosine", type=float, default=gate.MIN_COSINE,
        help="the gate: lowest single cosine INT8 vs FP32 per tower",
    )  # fmt: skip
    return parser.parse_args(argv)


#: Exit code of an export whose FP32 graphs are fine but whose INT8 files the gate refused.
INT8_REFUSED = 3


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
    tokenizer = args.tokenizer or (Path(env) if (env := os.environ.get("CLIP_TOKENIZER")) else None)
    try:
        # torch.onnx reports progress with print(): keep stdout for the answer (--print-dir is
        # read by scripts, e.g. the Dockerfile)
        with contextlib.redirect_stdout(sys.stderr):
            exported = ensure_exported(
                args.model, weights, args.cache_dir, fp16=not args.no_fp16, force=args.force,
                int8=args.int8, tokenizer=tokenizer,
            )  # fmt: skip
    except (WeightsUnavailableError, UnsupportedModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    refused = None
    if args.int8:
        thresholds = gate.Thresholds(args.int8_min_mean_cosine, args.int8_min_cosine)
        refused = gate.refusal((exported.int8 or {}).get("figures", {}), thresholds)
        if refused:
            print(f"error: {refused}; the FP32 export is complete", file=sys.stderr)
    if args.print_dir:
        print(exported.directory)
    else:
        print(json.dumps({"directory": str(exported.directory)} | exported.manifest, indent=2))
    return INT8_REFUSED if refused else 0


if __name__ == "__main__":
    sys.exit(main())
