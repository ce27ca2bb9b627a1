"""deploy/observability: the example stack wires OTLP to Jaeger and scrapes both metric routes."""

from __future__ import annotations

from pathlib import Path

import yaml

from clip_gateway.http.routes import ROUTES

STACK = Path(__file__).resolve().parents[2] / "deploy" / "observability"


def load(name: str) -> dict:
    return yaml.safe_load((STACK / name).read_text())


def test_collector_takes_otlp_http_and_grpc_and_exports_to_jaeger() -> None:
    config = load("otel-collector.yaml")
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["http"]["endpoint"].endswith(":4318")  # gateway and Triton export OTLP/HTTP
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    (pipeline,) = config["service"]["pipelines"].values()
    assert pipeline["receivers"] == ["otlp"]
    (exporter,) = pipeline["exporters"]
    assert config["exporters"][exporter]["endpoint"].startswith("jaeger:")


def test_compose_services_and_pinned_images() -> None:
    services = load("docker-compose.yml")["services"]
    assert set(services) == {"otel-collector", "jaeger", "prometheus"}
    for service in services.values():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), image
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    assert "4318:4318" in services["otel-collector"]["ports"]


def test_prometheus_scrapes_routes_the_gateway_serves() -> None:
    paths = {job["metrics_path"] for job in load("prometheus.yml")["scrape_configs"]}
    served = {path for handler in ROUTES for path in handler.paths}
    assert paths == {"/metrics", "/metrics/triton"}
    assert paths <= served


def test_prometheus_sends_the_key_it_is_given() -> None:
    """/metrics and /metrics/triton need a key: every job sends the file the service mounts."""
    mounted = {
        volume.split(":")[1]: volume.split(":")[0]
        for volume in load("docker-compose.yml")["services"]["prometheus"]["volumes"]
    }
    for job in load("prometheus.yml")["scrape_configs"]:
        key_file = job["authorization"]["credentials_file"]
        assert mounted[key_file] == "../compose/secrets/api-keys", job["job_name"]
