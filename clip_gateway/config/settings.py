"""Every setting, read from the environment once: one frozen ``Settings`` with a section per
concern, built by the launcher (or by the HTTP process for its own section) and passed down.

- ``ServerSettings`` (``GATEWAY_``): what the HTTP server process needs;
- ``RepositorySettings`` (``GATEWAY_TRITON_``): how Triton serves the model (rendered configs);
- ``LaunchSettings`` (``GATEWAY_``): where the model comes from, Triton's ports, the worker
  plan, stop and start-up timings: what the supervisor needs.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from clip_gateway.model.gate import MIN_COSINE, MIN_MEAN_COSINE

MiB = 1 << 20
#: Triton execution profiles (triton/profiles/*.pbtxt); ``cpu-int8`` is the ``cpu`` profile
#: serving the export's INT8 files (``python -m clip_gateway.export --int8``); ``cpu-bf16`` the
#: export's FP32 files on OpenVINO at BF16 inference precision (CPUs with AVX-512 BF16 or AMX,
#: profiles/bf16.py); ``cpu-int8-openvino`` OpenVINO's own INT8 of the FP32 files, built by NNCF
#: at the first start (profiles/int8_openvino.py).
Profile = Literal["cpu", "cpu-int8", "cpu-bf16", "cpu-int8-openvino", "cuda", "tensorrt"]
PROFILES: tuple[Profile, ...] = ("cpu", "cpu-int8", "cpu-bf16", "cpu-int8-openvino", "cuda",
                                 "tensorrt")  # fmt: skip
#: The profiles that run the model on the CPU (the Python backend): the core plan applies.
CPU_PROFILES: tuple[Profile, ...] = ("cpu", "cpu-int8", "cpu-bf16", "cpu-int8-openvino")

log = logging.getLogger(__name__)

#: Environment variables renamed since users set them: old name → new name. The old one is
#: still honoured (the new one wins when both are set), with a warning once per process.
RENAMED_ENV = {"GATEWAY_MAX_IMAGES_PER_REQUEST": "GATEWAY_MAX_ITEMS_PER_REQUEST"}
_warned: set[str] = set()


def use_new_names(environ: MutableMapping[str, str]) -> None:
    """Each renamed variable in ``environ`` under its new name only (a new name set wins),
    for child processes (``os.environ`` before uvicorn starts its workers): this process read
    the old one and warned; its children need not again."""
    for old, new in RENAMED_ENV.items():
        if old in environ:
            environ.setdefault(new, environ.pop(old))


def with_new_names(environ: Mapping[str, str]) -> dict[str, str]:
    """A child process's copy of ``environ``, through ``use_new_names``."""
    copy = dict(environ)
    use_new_names(copy)
    return copy


class RenamedEnv(PydanticBaseSettingsSource):
    """The settings source for ``RENAMED_ENV``'s old names, below the environment's own."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads the few names it knows

    def __call__(self) -> dict[str, Any]:
        prefix = str(self.config.get("env_prefix", ""))
        values: dict[str, Any] = {}
        for old, new in RENAMED_ENV.items():
            field = new.removeprefix(prefix).lower()
            if old not in os.environ or field not in self.settings_cls.model_fields:
                continue
            if new in os.environ:
                message = "%s is set and ignored: %s, its new name, is set too"
            else:
                values[field] = os.environ[old]
                message = "%s is deprecated: set %s instead"
            if old not in _warned:
                _warned.add(old)
                log.warning(message, old, new)
        return values


class ServerSettings(BaseSettings):
    """What the gateway's HTTP process reads from its environment; frozen once built."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True, extra="ignore")

    # --- HTTP -------------------------------------------------------------------------------
    #: Address uvicorn binds: loopback unless said otherwise; the container image sets
    #: ``0.0.0.0`` (the gateway is its one public port).
    host: str = "127.0.0.1"
    #: Port uvicorn listens on.
    port: int = Field(8000, ge=1, le=65535)
    #: uvicorn worker processes; 0 = from the CPUs this container may use (config/plan.py). The
    #: launcher (``clip-gateway serve``, the entrypoint) plans them where this is not set: thin
    #: single-thread workers on the gateway's share of the cores.
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
    #: Triton's HTTP endpoint (``http://host:port``), for the inference calls alone: a third of
    #: gRPC's CPU per call in the gateway, and less in Triton (backend/rest.py). The launcher
    #: sets it for the Triton it starts; unset, every call goes over gRPC.
    triton_http_url: str | None = None
    #: The image tower's name inside Triton.
    triton_model: str = "clip_image"
    #: The text tower beside it (absent: the gateway embeds images only, and says why).
    triton_text_model: str = "clip_text"
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
    #: Decode/resize threads per worker. Decoding releases the GIL; 0 = the core plan's
    #: (config/plan.py: one per worker as measured, or the usable CPUs shared between the
    #: workers when ``workers`` is set).
    decode_threads: int = Field(0, ge=0)
    #: Largest image (width x height, as its header claims) accepted; checked before decoding.
    max_image_pixels: int = Field(100_000_000, ge=1)
    #: Largest single encoded image.
    max_image_bytes: int = Field(32 * MiB, ge=1)
    #: Decoder memory one image may need, estimated from its header before decoding (a
    #: progressive JPEG's coefficient buffer, a PNG/WebP/GIF canvas). 256 MiB admits ~85 MP
    #: progressive JPEGs (any baseline JPEG within the pixel limit), ~64 MP RGB PNG, ~32 MP
    #: RGBA PNG and ~16 MP WebP (16 bytes per pixel measured, imaging/containers.py); with
    #: one decode per thread it keeps a 2-CPU, 4 GB container well inside its memory.
    max_decode_mib: int = Field(256, ge=16)
    #: Progressive JPEGs decoded at 1/8 scale skip their AC scans (see imaging/jpeg.py).
    progressive_dc_only: bool = True
    #: Decode prices against this CPU: ``measure`` decodes reference files of every coding at
    #: the HTTP process's start, once per machine (about a CPU-second; kept in
    #: ``decode_speed_record``, so later starts measure nothing), and admission prices decodes
    #: and the decode meter holds them by what it found (pipeline/decode_speed.py): the factors
    #: were measured on another CPU. ``factors``: the factors as they are.
    decode_speed_check: Literal["measure", "factors"] = "measure"
    #: Where the measured decode speed is kept (unset: ``decode-speed.json`` in the export cache,
    #: ``$CLIP_GATEWAY_CACHE`` or ``~/.cache/clip-gateway``; the launcher names its cache volume).
    decode_speed_record: Path | None = None
    #: This machine's decode speed per coding, as multiples of the factors, e.g.
    #: ``{"jpeg-progressive": 2.5}``: set by the HTTP process for its workers from what it
    #: measured; set it to pin them (nothing is measured).
    decode_speed: dict[str, float] = Field(default={})

    # --- limits -----------------------------------------------------------------------------
    #: Largest request body; a bigger Content-Length is refused before the body is read.
    max_body_bytes: int = Field(64 * MiB, ge=1024)
    #: Items (images and texts) in one request (formerly ``GATEWAY_MAX_IMAGES_PER_REQUEST``,
    #: still read, with a warning).
    max_items_per_request: int = Field(256, ge=1)
    #: Longest text, in characters (before tokenising; the model reads its first
    #: ``context_length`` tokens, as open_clip does: a 77-token context holds ~300 characters).
    max_text_chars: int = Field(4096, ge=1)
    #: Seconds of estimated work (decode + model, at the measured rate) admitted at once per
    #: worker; beyond it 429 with Retry-After. 0 = half the request deadline, so admitted work
    #: finishes in time even when the estimates are off by 2x (pipeline/admission.py).
    admission_horizon_s: float = Field(0.0, ge=0)
    #: Model seconds per image admission assumes; 0 = measured from the backend calls.
    admission_infer_s_per_image: float = Field(0.0, ge=0)
    #: Request body bytes being received at once per worker (counted as they arrive, never by
    #: Content-Length), in MiB; the request whose bytes would pass it gets 429.
    max_body_mib_in_flight: int = Field(256, ge=1)
    #: A request body must arrive within this time (slow-loris bodies get 408). A client that
    #: stops reading an answer has as long again to take the rest of it, else its connection
    #: is dropped (no slot or answer is held by a client that does not read).
    body_timeout_s: float = Field(30.0, gt=0)
    #: After ``upload_grace_s``, a body must keep arriving at this many bytes per second on
    #: average (else 408 and the connection is closed): stalled and trickling uploads cannot
    #: hold their slots for the whole body timeout. 0 = no minimum.
    min_upload_bytes_per_s: int = Field(8192, ge=0)
    #: Seconds a body may take before the minimum upload rate applies.
    upload_grace_s: float = Field(5.0, ge=0)
    #: With more than one API key: the share of the admission horizon one key may hold while
    #: admitted (beyond it that key gets 429 with the seconds its own work needs to drain).
    admission_key_share: float = Field(0.5, gt=0, le=1)
    #: A request whose image decodes spend more than this multiple of the CPU seconds they were
    #: priced at (measured per decode, thread CPU time) is stopped: its other images are not
    #: decoded, it gets 429 naming the item, and the coding's learned rate takes the measurement.
    admission_decode_overspend: float = Field(3.0, ge=1)
    #: A request's line and headers must arrive within this time of the connection opening or
    #: the request starting (else 408 and the connection is closed): idle or trickling
    #: connections cannot hold slots new clients need.
    header_timeout_s: float = Field(10.0, gt=0)
    #: Bytes a request's line and headers may take together (else 431 and the connection is
    #: closed): the HTTP parser joins a head's pieces in memory until it ends. 64 KiB holds
    #: any client's head (browsers and proxies stop at 8-16 KiB per line).
    max_head_bytes: int = Field(64 * 1024, ge=1024)
    #: Header fields one request may carry (else 431 and the connection is closed).
    max_header_fields: int = Field(100, ge=8)
    #: Open connections uvicorn accepts per worker before answering 503 (0 = no limit).
    max_connections: int = Field(2048, ge=0)
    #: On a stop, seconds in-flight requests get to finish once new connections are refused
    #: (after ``GATEWAY_STOP_DELAY_S``); at least the request timeout. config/timings.py
    #: derives the orchestrator's kill deadline from it.
    drain_s: float = Field(30.0, gt=0)

    # --- URL items and the embedding cache --------------------------------------------------
    #: Accept ``{"image": "https://..."}`` and ``{"type": "image_url", ...}`` items in JSON: the
    #: gateway fetches them through its guard (docs/API.md "URL items"). Off: such an item is a
    #: 400 saying how to turn it on.
    url_inputs: bool = False
    #: Hosts and networks (comma separated: ``images.internal,10.2.0.0/16``) a URL item may reach
    #: although the guard's deny list (loopback, private, link-local, ...) covers them.
    url_allow: Annotated[tuple[str, ...], NoDecode] = ()
    #: Seconds to connect to a URL item's server, per connection.
    url_connect_timeout_s: float = Field(3.0, gt=0)
    #: Seconds one URL item may take, redirects and the whole body included.
    url_timeout_s: float = Field(10.0, gt=0)
    #: URL fetches in flight at once per worker; a request that finds none free gets 429. With
    #: several API keys, one key holds at most ``admission_key_share`` of them.
    url_max_fetches: int = Field(32, ge=1)
    #: URL fetches one request runs at once (at most ``url_max_fetches``): the rest of the
    #: worker's stay free for other clients while its URLs are slow or dead.
    url_fetches_per_request: int = Field(8, ge=1)
    #: Content-addressed embedding cache in memory, in MiB per worker (0 = none): a repeated
    #: image or text is answered without decoding it or running the model. Off by default: a
    #: load test or benchmark that repeats its images would measure lookups, not the model.
    cache_mib: int = Field(0, ge=0)
    #: A SQLite file (WAL) that holds the cache instead, shared by the workers and kept across
    #: restarts, bounded by ``cache_mib``.
    cache_path: Path | None = None

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
    #: Serve without API keys on an address other than loopback. Without it the launcher refuses
    #: to start with no key configured there (the container listens on 0.0.0.0).
    anonymous: bool = False

    # --- observability ----------------------------------------------------------------------
    #: Log level of the gateway's own logs.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: ``json``: one object per line (route, status, images, duration, trace id); ``text``.
    log_format: Literal["json", "text"] = "json"
    #: ``auto``: on when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set.
    tracing: Literal["auto", "on", "off"] = "auto"
    #: Fraction of requests traced (decided at the edge; Triton traces exactly those).
    trace_sample_ratio: float = Field(1.0, ge=0, le=1)
    #: Obey an incoming traceparent's "sampled" flag. Off by default: a client could otherwise
    #: make the server (and Triton) trace every request whatever the ratio.
    trace_trust_upstream: bool = False
    #: Send the trace context on to Triton, which then adds its own spans (queue, compute) to
    #: each sampled request's trace. ``auto``: only to Triton 2.57 or later; before it Triton's
    #: tracer crashes the server under traced load (triton-inference-server/server#7795; the
    #: bundled 2.51 and NGC 25.01's 2.54 both have it). ``on``: to any Triton.
    triton_spans: Literal["auto", "on", "off"] = "auto"

    # --- Immich -----------------------------------------------------------------------------
    #: Also speak Immich's machine-learning protocol: ``GET /ping``, ``GET /`` and ``POST
    #: /predict`` (docs/IMMICH.md). Immich sends no API key, so with keys configured its
    #: ``/predict`` calls are refused: serve it without keys on loopback or a trusted network,
    #: or let a proxy beside Immich add the key (deploy/compose/immich-proxy.yml is one).
    immich: bool = False
    #: The model's Immich name, ``<open_clip model>__<pretrained tag>`` (``ViT-B-32__openai``):
    #: set by the launcher from the export when its weights are that pretrained tag; never for
    #: random weights or a checkpoint, which could not give Immich that model's embeddings.
    immich_name: str | None = None
    #: More names ``/predict`` answers to (comma separated): the operator vouching that these
    #: weights are that model (a checkpoint of it; random weights in tests).
    immich_aliases: Annotated[tuple[str, ...], NoDecode] = ()
    #: Immich's own machine-learning server(s) (comma separated, tried in order), e.g.
    #: ``http://immich-machine-learning:3003``: a ``/predict`` this gateway does not serve
    #: (faces, OCR, another model, several tasks) is forwarded there unchanged, so Immich needs
    #: one URL (docs/IMMICH.md). Unset: such requests get 501/409 and Immich tries its next URL.
    immich_upstream: Annotated[tuple[str, ...], NoDecode] = ()
    #: Seconds one forwarded request may take in all (sending the body, the upstream's answer);
    #: beyond it 504 (408 when it ran out waiting for the client's body). The connection itself
    #: must open within 5 s (or this, if shorter), else the next upstream is tried, then 503.
    immich_upstream_timeout_s: float = Field(60.0, gt=0)
    #: Forwarded requests in flight at once per worker, each until its client has taken the
    #: answer (at most 16 MiB held per forward); one more gets 503 at once. Forwards never take a
    #: decode thread or admission's budget: this is what bounds them.
    immich_upstream_concurrency: int = Field(32, ge=1)

    @field_validator("immich_upstream", mode="before")
    @classmethod
    def _upstream_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [url.strip() for url in value.split(",") if url.strip()]
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"immich_upstream: {url!r} is not an http:// or https:// URL")
        return tuple(url.rstrip("/") for url in value)

    @field_validator("triton_http_url")
    @classmethod
    def _http_endpoint(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"triton_http_url: {value!r} is not http://host:port")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"triton_http_url: {value!r} has no valid port") from exc
        if port is None:
            raise ValueError(f"triton_http_url: {value!r} names no port")
        return value.rstrip("/")

    @field_validator("immich_aliases", "url_allow", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @property
    def immich_names(self) -> tuple[str, ...]:
        """Every model name ``/predict`` answers to; empty: none (each request gets 409)."""
        named = (self.immich_name,) if self.immich_name else ()
        return tuple(dict.fromkeys((*named, *self.immich_aliases)))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """pydantic-settings' sources, with the renamed variables' old names below the
        environment (a new name set wins)."""
        renamed = RenamedEnv(settings_cls)
        return init_settings, env_settings, renamed, dotenv_settings, file_secret_settings

    @model_validator(mode="after")
    def _horizon_within_the_deadline(self) -> ServerSettings:
        if self.admission_horizon_s > self.request_timeout_s:
            raise ValueError("admission_horizon_s cannot exceed request_timeout_s")
        return self

    @property
    def horizon_s(self) -> float:
        return self.admission_horizon_s or self.request_timeout_s / 2

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


class RepositorySettings(BaseSettings):
    """How the model is served inside Triton. Env prefix ``GATEWAY_TRITON_``."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_TRITON_", frozen=True)

    #: Execution profile: ``cpu`` (Python backend + ORT CPU EP), ``cpu-int8`` (the same, with
    #: the export's INT8 files, held to the quality gate), ``cpu-bf16`` (the FP32 files on
    #: OpenVINO at BF16 inference precision, held to the same gate; CPUs with BF16 units only),
    #: ``cpu-int8-openvino`` (OpenVINO INT8 quantized by NNCF at the first start, held to the
    #: same gate), ``cuda`` (ORT CUDA EP), ``tensorrt`` (ORT TensorRT EP, FP16), or ``auto``:
    #: chosen by the launcher for the GPU it finds (clip_gateway/profiles/gpu.py); without a
    #: GPU by timing the gated CPU profiles on this machine (clip_gateway/profiles/cpu_auto.py).
    #: Rendering needs a concrete one.
    profile: Profile | Literal["auto"] = "auto"
    #: Largest batch Triton accepts; the gateway splits bigger requests to fit.
    max_batch_size: int = Field(32, ge=1, le=1024)
    #: Batch sizes the dynamic batcher sends as soon as it has them (values above max are dropped).
    preferred_batch_sizes: tuple[int, ...] = (4, 8, 16, 32)
    #: How long the batcher may hold a request to grow a batch.
    max_queue_delay_us: int = Field(2000, ge=0)
    #: Requests queued longer than this are rejected by Triton (the gateway answers 503).
    queue_timeout_us: int = Field(30_000_000, ge=0)
    #: Requests waiting in Triton's queue before new ones are rejected (0 = no count cap). The
    #: gateway's admission bounds the queue in seconds of work (and the queue timeout its age);
    #: a count cap would bite first on small requests (128 single images were ~5 s of work on
    #: the CPU profile while admission allows 15 s), turning admission's 429s into 503s.
    max_queue_size: int = Field(0, ge=0)
    #: Model instances per tower (CPU: processes; GPU: execution contexts on the one GPU);
    #: 0 = the core plan's on the CPU profiles (clip_gateway/profiles/plans.py), 1 on a GPU.
    instance_count: int = Field(0, ge=0)
    #: ORT intra-op threads per model instance on the CPU profiles; 0 = the core plan's (the
    #: launcher derives it from the CPUs it may use, clip_gateway/profiles/plans.py; by hand:
    #: ORT's own default, every core).
    cpu_threads: int = Field(0, ge=0)
    #: ORT's idle intra-op threads spin-wait for work (the Python backend's ``cpu`` profiles).
    #: Off: on a CPU profile the model shares its cores with the gateway's decoding.
    cpu_spinning: bool = False
    #: Graph precision for the ``cuda`` profile (``tensorrt`` always builds FP16 engines).
    cuda_precision: Literal["fp16", "fp32"] = "fp16"
    #: ONNX Runtime CUDA graphs: refused (true is an error). A graph is captured for one set of
    #: input shapes and buffer addresses, and the dynamic batcher, which every rendered config
    #: has, varies both from one execution to the next (triton/README.md).
    cuda_graph: bool = False
    #: The ``cuda`` profile on the Python backend: a thread waiting for the GPU sleeps until it
    #: is done (CUDA's blocking sync) instead of spinning on a core for as long as the GPU
    #: computes, CUDA's default on a host with more cores than contexts (triton/python/model.py).
    cuda_blocking_sync: bool = True
    #: Backend of the ``cpu`` profile: ``python`` (triton/python/model.py running ONNX Runtime;
    #: the PyPI tritonserver has no onnxruntime backend) or ``onnxruntime`` (Triton's native
    #: backend, KIND_CPU: the container image, whose Python backend has no ONNX Runtime).
    cpu_backend: Literal["python", "onnxruntime"] = "python"
    #: Backend of the ``cuda`` profile: ``onnxruntime`` (Triton's native backend: the NGC image)
    #: or ``python`` (triton/python/model.py running ONNX Runtime's CUDA EP with the same
    #: options: a Triton with only the Python backend, such as the PyPI tritonserver; its
    #: interpreter needs onnxruntime-gpu; docs/GPU_HOST.md).
    gpu_backend: Literal["onnxruntime", "python"] = "onnxruntime"
    #: Where TensorRT engines and timing caches live; mount a volume here. The launcher uses a
    #: subdirectory per GPU model and model identity (weights + export code, profiles/engines.py).
    trt_cache_path: str = "/var/cache/clip-gateway/trt"
    #: TensorRT's builder workspace per engine, in bytes.
    trt_workspace_bytes: int = Field(4 << 30, ge=1 << 26)
    #: Model-repository templates (base.pbtxt, profiles/, python/) to render instead of the
    #: shipped ``triton/``: site-specific configs, and the tests' slow-loading model.
    templates_dir: Path | None = None
    #: Batch sizes run through the model before it turns READY (default: 1, preferred sizes and
    #: max for GPU profiles; 1 for ``cpu``).
    warmup_batch_sizes: tuple[int, ...] | None = None

    @model_validator(mode="after")
    def _batch_sizes_fit(self) -> RepositorySettings:
        too_big = [b for b in self.warmup_batch_sizes or () if b > self.max_batch_size]
        if too_big:
            raise ValueError(f"warmup batch sizes {too_big} exceed max_batch_size")
        if self.cuda_graph:
            raise ValueError(
                "cuda_graph is refused: every rendered config batches dynamically, so shapes "
                "and buffers change per execution, and ONNX Runtime replays a CUDA graph only "
                "for the fixed shapes and addresses it captured"
            )
        return self

    @property
    def preferred(self) -> tuple[int, ...]:
        fitting = sorted({b for b in self.preferred_batch_sizes if 1 <= b <= self.max_batch_size})
        return tuple(fitting) or (self.max_batch_size,)

    @property
    def warmup(self) -> tuple[int, ...]:
        if self.warmup_batch_sizes is not None:
            return tuple(sorted(set(self.warmup_batch_sizes)))
        if self.profile in CPU_PROFILES:
            return (1,)
        return tuple(sorted({1, *self.preferred, self.max_batch_size}))


class LaunchSettings(BaseSettings):
    """What the supervisor reads (env prefix ``GATEWAY_``): the model, Triton, stop timings."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True, extra="ignore")

    #: An export directory (``python -m clip_gateway.export``: model.onnx, manifest.json), e.g.
    #: the one baked into the container image. Unset: ``model`` + ``weights`` from the export
    #: cache, exported in a child process on first use.
    model_dir: Path | None = None
    #: open_clip model name, when exporting.
    model: str = "ViT-B-32"
    #: open_clip pretrained tag, a checkpoint path, or ``random`` (tests and benchmarks only).
    weights: str = "laion2b_s34b_b79k"
    #: A directory with the model's Hugging Face tokenizer files (SigLIP, SigLIP2, multilingual
    #: towers), when exporting; unset: the exporter fetches them from the hub, or serves images
    #: only if it cannot (docs/MODELS.md).
    tokenizer: Path | None = None
    #: Export cache (default ``$CLIP_GATEWAY_CACHE`` or ``~/.cache/clip-gateway``).
    cache_dir: Path | None = None
    #: Measure both GPU profiles on first start and keep the winner (cached with the engines).
    calibrate: bool = False
    #: ``auto`` without a GPU: seconds the first start's background measurement may spend
    #: timing the CPU profiles that pass the quality gate through Triton (profiles/cpu_auto.py)
    #: while the gateway already serves; the figures and the choice are kept beside the export,
    #: so later starts on the same machine serve the choice at once, measuring nothing.
    auto_measure_s: float = Field(120.0, gt=0)
    #: A CPU profile's first start on this machine: seconds the background measurement may
    #: spend timing its core plans (1 x N, 2 x N/2, ... model instances x threads; each in a
    #: Triton of its own, batch-32 throughput and one image's latency) while the gateway already
    #: serves with the table's plan; the choice is kept beside the export
    #: (profiles/planner.py), so later starts here serve it at once, measuring nothing. 0: never
    #: measured here (a plan recorded earlier still serves; else the table's).
    plan_measure_s: float = Field(60.0, ge=0)
    #: ``cpu-int8`` when the quality gate refuses the export's INT8 files: serve the FP32 files
    #: (saying so in the log and in /v1/models) instead of refusing to start.
    int8_fallback: bool = False
    #: ``cpu-bf16`` named explicitly when the quality gate refuses OpenVINO's BF16 figures: serve
    #: the ``cpu`` profile (saying so) instead of refusing to start. ``auto`` always falls back.
    bf16_fallback: bool = False
    #: The INT8 quality gate (model/gate.py): mean and lowest cosine, INT8 vs FP32, each tower
    #: must reach on the export's calibration set, checked again at every ``cpu-int8`` start;
    #: the ``cpu-bf16`` and ``cpu-int8-openvino`` profiles are held to the same thresholds.
    int8_min_mean_cosine: float = Field(MIN_MEAN_COSINE, gt=0, le=1)
    #: The lowest cosine of any one calibration item under the same gate.
    int8_min_cosine: float = Field(MIN_COSINE, gt=0, le=1)
    #: Triton's loopback gRPC port, never published; 0 = reserve a free one.
    triton_grpc_port: int = Field(0, ge=0, le=65535)
    #: Triton's loopback HTTP port (its readiness), never published; 0 = reserve a free one.
    triton_http_port: int = Field(0, ge=0, le=65535)
    #: Triton's loopback Prometheus port (re-exposed as /metrics/triton); 0 = a free one.
    triton_metrics_port: int = Field(0, ge=0, le=65535)
    #: After SIGTERM, keep serving this long before the drain starts: Kubernetes removes a
    #: terminating pod from its endpoints while the SIGTERM is on its way, and kube-proxy,
    #: ingresses and load balancers take seconds to follow; what a preStop sleep does, but
    #: under any orchestrator and without a shell in the image. A second signal skips it.
    stop_delay_s: float = Field(0.0, ge=0)
    #: Seconds Triton gets to exit after the gateway has stopped.
    triton_grace_s: float = Field(15.0, gt=0)
    #: Longest start-up (export, Triton READY incl. TensorRT engine builds and calibration,
    #: gateway ready); the probes and HEALTHCHECK in deploy/ allow a little more
    #: (config/timings.py), so this gives up first and says why.
    startup_timeout_s: float = Field(1800.0, gt=0)
    #: Where Triton's and the gateway's own logs go; unset: this process's stdout/stderr (a
    #: container's log). ``clip-gateway serve`` defaults to a file and prints progress only.
    log_file: Path | None = None
    #: Scratch space for rendered model repositories (a private directory is made inside);
    #: unset: the system's temporary directory (``TMPDIR``).
    scratch_dir: Path | None = None


@dataclass(frozen=True)
class Settings:
    """The one settings object: built once (``from_env``) and passed down by section."""

    server: ServerSettings
    repository: RepositorySettings
    launch: LaunchSettings

    @classmethod
    def from_env(
        cls,
        server: dict[str, Any] | None = None,
        repository: dict[str, Any] | None = None,
        launch: dict[str, Any] | None = None,
    ) -> Settings:
        """Read the environment; the dicts override it (command-line flags)."""
        return cls(
            ServerSettings(**(server or {})),
            RepositorySettings(**(repository or {})),
            LaunchSettings(**(launch or {})),
        )


def load_api_keys(settings: ServerSettings) -> tuple[bytes, ...]:
    """Keys from GATEWAY_API_KEYS and GATEWAY_API_KEYS_FILE (one per line, # comments)."""
    keys = [key.get_secret_value() for key in settings.api_keys]
    if settings.api_keys_file is not None:
        for line in settings.api_keys_file.read_text().splitlines():
            key = line.split("#", 1)[0].strip()
            if key:
                keys.append(key)
    return tuple(key.encode() for key in keys if key)


def immich_protection(settings: ServerSettings) -> str:
    """How the Immich routes are protected as configured, in one sentence for the log."""
    if load_api_keys(settings):
        return (
            "API keys are configured, so /predict needs one: put a proxy beside Immich that "
            "adds it (deploy/compose/immich-proxy.yml), or Immich gets 401 and tries its next URL"
        )
    if is_loopback(settings.host):
        return f"no API keys; served on loopback ({settings.host}) only"
    return (
        f"no API keys and {settings.host} is not loopback: anyone who can reach this port can "
        "use the model; keep it on a trusted network or behind a key-adding proxy"
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(settings: ServerSettings) -> str | None:
    """Why this gateway must not start as configured, or None: without an API key it serves
    only on loopback, unless the operator says ``GATEWAY_ANONYMOUS=true``."""
    try:
        keys = load_api_keys(settings)
    except OSError as exc:
        return f"GATEWAY_API_KEYS_FILE cannot be read: {exc}"
    if keys or settings.anonymous or is_loopback(settings.host):
        return None
    held = settings.api_keys_file
    where = f" ({held} holds none)" if held is not None else ""
    return (
        f"no API key configured{where} and {settings.host} is not a loopback address: set "
        "GATEWAY_API_KEYS_FILE (one key per line) or GATEWAY_API_KEYS, or GATEWAY_ANONYMOUS=true "
        "to serve without keys"
    )
