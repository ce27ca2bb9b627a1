"""deploy/ and the Dockerfile agree with the code: schemas, probes, ports, env names, metrics."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from gateway.http.routes import ROUTES
from gateway.observability.metrics import Metrics
from gateway.runtime.settings import LaunchSettings, RepositorySettings, ServerSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SETTINGS = (ServerSettings, RepositorySettings, LaunchSettings)
KNOWN_ENV = {
    f"{cls.model_config['env_prefix']}{name}".upper()
    for cls in SETTINGS
    for name in cls.model_fields
}
ROUTE_PATHS = {path for handler in ROUTES for path in handler.paths}
PORT = ServerSettings().port


def kustomize() -> list[dict]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [yaml.safe_load((K8S / name).read_text()) for name in kustomization["resources"]]


def by_kind(kind: str) -> dict:
    (doc,) = [d for d in kustomize() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("version", ["1.28", "1.30"])
def test_manifests_validate_against_kubernetes_schemas(version: str) -> None:
    for doc in kustomize():
        kubernetes_validate.validate(doc, version, strict=True)


def test_probes_ports_and_env_agree_with_the_gateway() -> None:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": PORT}]
    probes = {
        k: container[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    assert probes["readinessProbe"]["path"] == probes["startupProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert {p["path"] for p in probes.values()} <= ROUTE_PATHS
    assert all(p["port"] == "http" for p in probes.values())
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # TRT engine builds
    for env in container["env"]:
        assert env["name"] in KNOWN_ENV or env["name"].startswith("OTEL_"), env["name"]
    drain = next(float(e["value"]) for e in container["env"] if e["name"] == "GATEWAY_DRAIN_S")
    assert pod["terminationGracePeriodSeconds"] > drain  # the drain finishes before SIGKILL
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert RepositorySettings().trt_cache_path.startswith("/var/cache/clip-gateway")
    assert {"/var/cache/clip-gateway", "/tmp", "/dev/shm"} <= mounts


def test_pods_are_locked_down() -> None:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    context = pod["containers"][0]["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]


def test_service_hpa_and_pdb_select_the_pods() -> None:
    labels = by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    for kind, path in (("Service", ["spec", "selector"]),
                       ("PodDisruptionBudget", ["spec", "selector", "matchLabels"])):  # fmt: skip
        selector = by_kind(kind)
        for key in path:
            selector = selector[key]
        assert selector.items() <= labels.items()
    assert by_kind("Service")["spec"]["ports"][0]["targetPort"] == "http"
    hpa = by_kind("HorizontalPodAutoscaler")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric in Metrics().registry._names_to_collectors  # the gauge the gateway exports
    assert hpa["spec"]["scaleTargetRef"]["name"] == by_kind("Deployment")["metadata"]["name"]
    adapter = yaml.safe_load((K8S / "prometheus-adapter-rules.yaml").read_text())
    assert metric in adapter["rules"][0]["seriesQuery"]


def test_dockerfile() -> None:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    runtime = parser.baseimage
    assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d{2}\.\d{2}-py3", runtime), runtime
    final = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    last_from = max(i for i, ins in enumerate(final) if ins["instruction"] == "FROM")
    stage = final[last_from:]

    def values(name: str) -> list[str]:
        return [i["value"] for i in stage if i["instruction"] == name]

    (user,) = values("USER")
    assert user not in ("root", "0")
    assert values("EXPOSE") == [str(PORT)]
    (healthcheck,) = values("HEALTHCHECK")
    assert f"127.0.0.1:{PORT}/healthz" in healthcheck
    (entrypoint,) = values("ENTRYPOINT")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "clip-gateway-entrypoint" in entrypoint
    assert scripts["clip-gateway-entrypoint"] == "gateway.runtime.supervisor:main"
    assert any("/var/cache/clip-gateway" in v for v in values("VOLUME"))
    for name in re.findall(r"\b(GATEWAY_[A-Z_]+)=", " ".join(values("ENV"))):
        assert name in KNOWN_ENV, name
    assert "COPY --from=export" in parser.content  # the model is baked in at build time


def test_compose_pins_one_gpu_per_gateway_behind_least_conn() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "docker-compose.yml").read_text())
    gateways = {name: s for name, s in compose["services"].items() if name.startswith("gateway-")}
    devices = [
        s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for s in gateways.values()
    ]
    assert sorted(d[0] for d in devices) == [str(i) for i in range(len(gateways))]
    assert len({s["volumes"][0] for s in gateways.values()}) == len(gateways)  # cache per GPU
    for service in gateways.values():
        assert set(service["environment"]) <= KNOWN_ENV | {"OTEL_EXPORTER_OTLP_ENDPOINT"}
    assert compose["services"]["lb"]["ports"] == [f"{PORT}:{PORT}"]
    nginx = (ROOT / "deploy" / "compose" / "nginx.conf").read_text()
    assert "least_conn;" in nginx
    for name in gateways:
        assert f"server {name}:{PORT}" in nginx
