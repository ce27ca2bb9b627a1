"""How much each suite measures. ``smoke`` is CI's (a minute); ``quick`` < 3 min; ``full`` < 20."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    name: str
    single_count: int
    single_warmup: int
    batches: tuple[int, ...]
    batch_count: int
    concurrency: tuple[int, ...]
    point_seconds: float
    decode_seconds: float
    decode_full_sets: bool
    null_seconds: float
    shm_calls: int
    distinct_images: int
    #: systems whose concurrency sweep runs (the JSON-response gateway only does batches)
    sweep_systems: tuple[str, ...] = ("gateway", "pytorch", "triton-grpc", "triton-http")


SUITES = {
    "smoke": Suite(
        "smoke", single_count=3, single_warmup=1, batches=(1, 32), batch_count=1,
        concurrency=(2,), point_seconds=1.0, decode_seconds=0.2, decode_full_sets=False,
        null_seconds=2.0, shm_calls=2, distinct_images=8,
    ),
    "quick": Suite(
        "quick", single_count=20, single_warmup=3, batches=(1, 4, 8, 16, 32), batch_count=2,
        concurrency=(1, 8, 64), point_seconds=2.0, decode_seconds=0.5,
        decode_full_sets=False, null_seconds=3.0, shm_calls=5, distinct_images=32,
        sweep_systems=("gateway", "pytorch", "triton-grpc"),
    ),
    "full": Suite(
        "full", single_count=100, single_warmup=10, batches=(1, 4, 8, 16, 32), batch_count=8,
        concurrency=(1, 2, 4, 8, 16, 32, 64), point_seconds=10.0, decode_seconds=4.0,
        decode_full_sets=True, null_seconds=15.0, shm_calls=30, distinct_images=64,
    ),
}  # fmt: skip
