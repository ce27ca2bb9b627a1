"""The gateway's HTTP process as the supervisor starts it beside Triton: its worker plan (config/
plan.py, from the served profile's figures) and what it learns of the model served."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from clip_gateway.config import plan
from clip_gateway.config.processes import GatewayProcess
from clip_gateway.config.settings import CPU_PROFILES, Settings
from clip_gateway.launcher.local import LocalTriton
from clip_gateway.model.spec import immich_name
from clip_gateway.pipeline import decode_speed
from clip_gateway.profiles.choice import Serving


def gateway_for(
    settings: Settings,
    serving: Serving,
    triton: LocalTriton,
    scratch: Path,
    stop: threading.Event,
) -> tuple[GatewayProcess, str]:
    """The gateway's process (not started) in front of ``triton``, and how its workers were
    planned (the ready line)."""
    server, launch = settings.server, settings.launch
    workers, how = plan.gateway_plan(server, serving.figures,
                                     model_spans_cpus=serving.profile in CPU_PROFILES)  # fmt: skip
    env = {
        "GATEWAY_WORKERS": str(workers.workers),
        "GATEWAY_DECODE_THREADS": str(workers.decode_threads),
        "GATEWAY_TRITON_METRICS_URL": triton.metrics_url,
    }
    manifest = json.loads((serving.export_dir / "manifest.json").read_text())
    if "model_id" not in server.model_fields_set:
        # the public id names the model served (CLIP_MODEL), unless GATEWAY_MODEL_ID is set
        env["GATEWAY_MODEL_ID"] = manifest["model"]
    if server.immich:
        env["GATEWAY_IMMICH"] = "true"  # --immich reaches the HTTP process too
        if "immich_name" not in server.model_fields_set:
            env["GATEWAY_IMMICH_NAME"] = immich_name(manifest) or ""
        if server.immich_upstream:  # --immich-upstream reaches it too
            env["GATEWAY_IMMICH_UPSTREAM"] = ",".join(server.immich_upstream)
    if "decode_speed_record" not in server.model_fields_set:
        # the decode speed measured at the gateway's first start here, kept in the cache
        # volume beside the engines and the CPU profile choice (the user's cache otherwise)
        env["GATEWAY_DECODE_SPEED_RECORD"] = str(
            Path(settings.repository.trt_cache_path) / decode_speed.RECORD
        )
    if workers.workers > 1:
        # each worker counts for itself; prometheus-client sums them through files here
        metrics_dir = scratch / "metrics"
        metrics_dir.mkdir(mode=0o700)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    gateway = GatewayProcess(triton.grpc_url, env=env, host=server.host, port=server.port,
                             triton_http_url=triton.http_url,
                             inherit_output=launch.log_file is None, log_path=launch.log_file,
                             stop_requested=stop)  # fmt: skip
    return gateway, how
