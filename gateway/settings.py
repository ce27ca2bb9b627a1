"""The gateway's one settings object (env prefix ``GATEWAY_``), built by the app factory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.contract import TRITON_MODEL_NAME

MiB = 1 << 20


class GatewaySettings(BaseSettings):
    """Everything the gateway process reads from its environment; frozen once built."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True, extra="ignore")

    # --- HTTP -------------------------------------------------------------------------------
    #: Address uvicorn binds (the container publishes only this port).
    host: str = "0.0.0.0"  # the gateway is the container's one public port
    port: int = Field(8000, ge=1, le=65535)
    #: uvicorn worker processes; 0 = derived from the CPU count (see gateway/__main__.py).
    workers: int = Field(1, ge=0)
    #: An inherited, already listening socket to serve on instead of binding host:port (set by
    #: launchers that bind the port themselves, so no other process can take it in between).
    listen_fd: int | None = Field(None, ge=0)

    # --- model ------------------------------------------------------------------------------
    #: Public model id in requests, responses and /v1/models.
    model_id: str = "ViT-B-32"
    #: Other names accepted in a request's ``model`` field (e.g. an OpenAI model name a client
    #: cannot change). A request naming anything else gets 404.
    model_aliases: tuple[str, ...] = ()

    # --- Triton -----------------------------------------------------------------------------
    #: Triton's gRPC endpoint; loopback in the one-container-per-GPU layout.
    triton_url: str = "127.0.0.1:8001"
    triton_model: str = TRITON_MODEL_NAME
    #: Triton's Prometheus endpoint, re-exposed as GET /metrics/triton (unset: not re-exposed).
    triton_metrics_url: str | None = None
    #: Deadline of a whole /v1/embeddings request, carried into the gRPC call as its timeout.
    request_timeout_s: float = Field(30.0, gt=0)
    #: Largest batch sent to Triton per call; 0 = the model's own max_batch_size.
    max_batch_size: int = Field(0, ge=0)
    #: Input tensors through POSIX shared memory instead of the gRPC message: ``auto`` when
    #: Triton's address is loopback (same host, same /dev/shm), ``on``, ``off``.
    triton_shared_memory: Literal["auto", "on", "off"] = "auto"
    #: Shared-memory regions per worker (each one max batch, 4.8 MB for 32 images at 224 px);
    #: calls beyond them use gRPC.
    triton_shm_regions: int = Field(8, ge=1)

    # --- preprocessing ----------------------------------------------------------------------
    #: Decode/resize threads. Decoding releases the GIL, so threads scale across cores; 0 = one
    #: per CPU available to this process.
    decode_threads: int = Field(0, ge=0)
    #: Largest image (width x height, as its header claims) accepted; checked before decoding.
    max_image_pixels: int = Field(100_000_000, ge=1)
    #: Largest single encoded image.
    max_image_bytes: int = Field(32 * MiB, ge=1)
    #: Progressive JPEGs decoded at 1/8 scale skip their AC scans (see gateway/jpeg.py).
    progressive_dc_only: bool = True

    # --- limits -----------------------------------------------------------------------------
    #: Largest request body; a bigger Content-Length is refused before the body is read.
    max_body_bytes: int = Field(64 * MiB, ge=1024)
    max_images_per_request: int = Field(256, ge=1)
    #: Images admitted (decoding, queued or in Triton) at once per worker; beyond it, 429.
    max_inflight_images: int = Field(512, ge=1)
    #: A request body must arrive within this time (slow-loris bodies get 408).
    body_timeout_s: float = Field(30.0, gt=0)
    #: Open connections uvicorn accepts per worker before answering 503 (0 = no limit).
    max_connections: int = Field(2048, ge=0)

    # --- readiness canary -------------------------------------------------------------------
    #: Seconds between canary inferences on a fixed image (0 = no canary).
    canary_interval_s: float = Field(15.0, ge=0)
    #: Cosine the canary embedding must keep against the export-time reference.
    canary_min_cosine: float = Field(0.99, gt=0, le=1)

    # --- security ---------------------------------------------------------------------------
    #: Accepted API keys (JSON list); when any key is set, /v1/* needs `Authorization: Bearer`.
    api_keys: tuple[SecretStr, ...] = ()
    #: A file with one API key per line (comments with #), read at start.
    api_keys_file: Path | None = None

    # --- observability ----------------------------------------------------------------------
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: ``json``: one object per line (route, status, images, duration, trace id); ``text``.
    log_format: Literal["json", "text"] = "json"
    #: ``auto``: on when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set.
    tracing: Literal["auto", "on", "off"] = "auto"

    @property
    def decode_workers(self) -> int:
        if self.decode_threads:
            return self.decode_threads
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )

    @model_validator(mode="after")
    def _requests_fit_the_budget(self) -> GatewaySettings:
        if self.max_images_per_request > self.max_inflight_images:
            raise ValueError("max_images_per_request cannot exceed max_inflight_images")
        return self

    @property
    def shared_memory_regions(self) -> int:
        """Regions to use (0: none), resolving ``auto`` from the Triton address."""
        if self.triton_shared_memory == "off":
            return 0
        if self.triton_shared_memory == "on":
            return self.triton_shm_regions
        host = self.triton_url.rsplit(":", 1)[0].strip("[]")
        return self.triton_shm_regions if host in ("127.0.0.1", "localhost", "::1") else 0

    def accepts_model(self, name: str | None) -> bool:
        return name is None or name == self.model_id or name in self.model_aliases
