"""deploy/ and the Dockerfile, checked offline with the tools that judge them and against the
code: kustomize's output against strict Kubernetes schemas (oldest and newest supported
versions), compose against the compose specification, ``nginx -t``, hadolint; then what the
files mean: every timing consistent with config/timings.py, probes that can pass, the worker
plan applied, restricted pods, an engine cache a non-root pod can write, a complete HPA path."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from clip_gateway.config import plan, timings
from clip_gateway.config.settings import (
    LaunchSettings,
    RepositorySettings,
    ServerSettings,
    Settings,
    exposure_problem,
)
from clip_gateway.http.routes import ROUTES
from clip_gateway.observability.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "deploy" / "compose"
SETTINGS = (ServerSettings, RepositorySettings, LaunchSettings)
KNOWN_ENV = {
    f"{cls.model_config['env_prefix']}{name}".upper()
    for cls in SETTINGS
    for name in cls.model_fields
}
ROUTE_PATHS = {path for handler in ROUTES for path in handler.paths}
PORT = ServerSettings().port
#: Oldest and newest Kubernetes the manifests are validated for (kubernetes-validate's schemas).
K8S_VERSIONS = ("1.28", "1.37")
#: Restricted Pod Security Standard: the only volume types a pod may use.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip


def tool(name: str) -> str:
    """A validator from this environment's packages (venv first), or fail saying where from."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: `make install` installs it (pyproject.toml, dev extra)")
    return found


def run(*command: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)


# --- Kubernetes ----------------------------------------------------------------------------


def kustomize() -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/k8s` applies: kustomize's own rendering."""
    result = run(tool("kubectl"), "kustomize", str(K8S))
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return kustomize()


@pytest.fixture(scope="module")
def pod(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(rendered, "Deployment")["spec"]["template"]["spec"]
    return spec


def container_env(pod: dict[str, Any]) -> dict[str, str]:
    (container,) = pod["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def settings_under(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a container with this environment (plus the image's) reads."""
    for name in list(os.environ):
        if name.startswith("GATEWAY_"):
            monkeypatch.delenv(name)
    for name, value in {**image_env(), **env}.items():
        monkeypatch.setenv(name, value)
    return Settings.from_env()


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kustomize_output_validates_strictly(rendered: list[dict[str, Any]], version: str) -> None:
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds == sorted(["Namespace", "Deployment", "PersistentVolumeClaim", "Service",
                            "HorizontalPodAutoscaler", "PodDisruptionBudget"])  # fmt: skip
    for doc in rendered:
        kubernetes_validate.validate(doc, version, strict=True)
    broken = copy.deepcopy(by_kind(rendered, "Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["timeout"] = 6
    with pytest.raises(kubernetes_validate.ValidationError):  # the validator does reject
        kubernetes_validate.validate(broken, version, strict=True)


def test_stop_timings_follow_from_the_settings(
    pod: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    derived = timings.derive(settings_under(container_env(pod), monkeypatch))
    assert derived.problems() == []
    assert derived.stop_delay_s > 0  # endpoints let go before the socket closes
    assert derived.drain_s >= derived.request_timeout_s  # accepted work finishes
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= derived.stop_s + timings.HEADROOM_S  # SIGKILL only after the whole stop
    assert grace <= derived.kill_after_s + 30  # and not a pod that hangs on for minutes
    assert "lifecycle" not in pod["containers"][0]  # the stop delay is the entrypoint's


def test_probes_can_pass_and_agree_with_the_start_up_budget(
    pod: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (container,) = pod["containers"]
    derived = timings.derive(settings_under(container_env(pod), monkeypatch))
    startup, readiness, liveness = (
        container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")
    )
    assert startup["httpGet"]["path"] == readiness["httpGet"]["path"] == "/readyz"
    assert liveness["httpGet"]["path"] == "/healthz"
    for probe in (startup, readiness, liveness):
        assert probe["httpGet"]["path"] in ROUTE_PATHS
        assert probe["httpGet"]["port"] == "http"
        assert probe["timeoutSeconds"] <= probe["periodSeconds"]
    for probe in (startup, readiness):  # /readyz may wait on Triton this long
        assert probe["timeoutSeconds"] > timings.READY_CHECK_TIMEOUT_S
    # the entrypoint's own start-up timeout fires first, with its reason in the log
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget >= derived.startup_timeout_s + timings.HEADROOM_S
    assert budget <= derived.startup_timeout_s + 120
    assert container["ports"] == [{"name": "http", "containerPort": PORT}]


def test_the_worker_plan_is_what_the_pod_runs(pod: dict[str, Any], tmp_path: Path) -> None:
    (container,) = pod["containers"]
    env = {**image_env(), **container_env(pod)}
    assert env["GATEWAY_WORKERS"] == "0"  # planned, not pinned
    assert "GATEWAY_DECODE_THREADS" not in env
    resources = container["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"]  # the quota is real
    cpus = int(resources["limits"]["cpu"])
    (tmp_path / "cpu.max").write_text(f"{cpus * 100_000} 100000\n")  # what the kubelet writes
    assert plan.cgroup_cpu_quota(tmp_path) == cpus
    workers = plan.worker_plan(cpus, int(env["GATEWAY_WORKERS"]))
    assert workers.workers > 1 and workers.workers * workers.decode_threads == cpus


def test_env_names_are_settings(pod: dict[str, Any]) -> None:
    for name in container_env(pod):
        assert name in KNOWN_ENV or name.startswith("OTEL_"), name


def test_pods_meet_the_restricted_standard(
    rendered: list[dict[str, Any]], pod: dict[str, Any]
) -> None:
    labels = by_kind(rendered, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
    assert context["seccompProfile"]["type"] == "RuntimeDefault"
    assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys()
    for volume in pod["volumes"]:
        kinds = set(volume) - {"name"}
        assert kinds <= RESTRICTED_VOLUMES, volume  # no hostPath
    (container,) = pod["containers"]
    own = container["securityContext"]
    assert own["allowPrivilegeEscalation"] is False
    assert own["readOnlyRootFilesystem"] is True
    assert own["capabilities"]["drop"] == ["ALL"] and "add" not in own["capabilities"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_engine_cache_is_a_shared_claim_the_pod_can_write(
    rendered: list[dict[str, Any]], pod: dict[str, Any]
) -> None:
    (container,) = pod["containers"]
    cache = container_env(pod)["GATEWAY_TRITON_TRT_CACHE_PATH"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (name,) = [n for n, path in mounts.items() if cache.startswith(path + "/")]
    claim = volumes[name]["persistentVolumeClaim"]["claimName"]
    pvc = by_kind(rendered, "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == claim
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # every pod, any node
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert {"/tmp", "/dev/shm"} <= set(mounts.values())  # the root filesystem is read-only


def test_the_pod_requires_an_api_key(
    rendered: list[dict[str, Any]], pod: dict[str, Any], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Secure by default: the keys file is a mounted Secret the pod cannot start without, and an
    empty one stops the entrypoint; only an explicit GATEWAY_ANONYMOUS=true serves keyless."""
    (container,) = pod["containers"]
    env = container_env(pod)
    keys_file = Path(env["GATEWAY_API_KEYS_FILE"])
    assert env["GATEWAY_ANONYMOUS"] == "false"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(keys_file.parent)]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert not secret.get("optional", False)  # no Secret: the pod waits, it does not run open
    assert secret["defaultMode"] & 0o007 == 0  # not world-readable
    # what the entrypoint decides, with the Secret's file empty, then holding a key
    local = tmp_path / keys_file.name
    local.write_text("")
    server = settings_under({**env, "GATEWAY_API_KEYS_FILE": str(local)}, monkeypatch).server
    assert server.host == "0.0.0.0" and exposure_problem(server) is not None
    local.write_text("k-1\n")
    assert exposure_problem(server) is None
    # Prometheus sends a key from the same Secret, on both metric routes
    monitor = yaml.safe_load((K8S / "autoscaling" / "podmonitor.yaml").read_text())
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert {e["path"] for e in endpoints} == {"/metrics", "/metrics/triton"} <= ROUTE_PATHS
    for endpoint in endpoints:
        credentials = endpoint["authorization"]["credentials"]
        assert credentials["name"] == secret["secretName"]
        assert endpoint["port"] == container["ports"][0]["name"]
    labels = by_kind(rendered, "Deployment")["spec"]["template"]["metadata"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels["labels"].items()
    # annotation discovery cannot send a key: it would only collect 401s
    assert not any(k.startswith("prometheus.io/") for k in labels.get("annotations", {}))


RAYJOB = K8S / "bulk" / "rayjob.yaml"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_bulk_rayjob_runs_the_bulk_command_on_restricted_pods_against_the_service(
    rendered: list[dict[str, Any]], version: str
) -> None:
    """deploy/k8s/bulk/rayjob.yaml (docs/BULK.md): KubeRay's CRD is not in the schemas, so its
    pod templates are validated as PodTemplates, held to the namespace's restricted standard;
    its command is parsed by the command itself and sends to deploy/k8s's Service."""
    from clip_gateway.bulk.cli import bulk

    (job,) = [d for d in yaml.safe_load_all(RAYJOB.read_text()) if d]
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["metadata"]["namespace"] == by_kind(rendered, "Namespace")["metadata"]["name"]
    cluster = job["spec"]["rayClusterSpec"]
    ray = next(line for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
               if line.startswith("ray=="))  # fmt: skip
    assert cluster["rayVersion"] == ray.removeprefix("ray==")
    templates = [cluster["headGroupSpec"]["template"]]
    templates += [group["template"] for group in cluster["workerGroupSpecs"]]
    for template in templates:
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "bulk"},
                   "template": template}  # fmt: skip
        kubernetes_validate.validate(wrapped, version, strict=True)
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        (container,) = spec["containers"]
        assert container["image"].endswith(f":{cluster['rayVersion']}-py311")
        own = container["securityContext"]
        assert own["allowPrivilegeEscalation"] is False and own["capabilities"]["drop"] == ["ALL"]
    words = job["spec"]["entrypoint"].split()
    assert words[:2] == ["clip-gateway", "bulk"]
    context = bulk.make_context("bulk", words[2:])  # the command's own parser takes it
    service = by_kind(rendered, "Service")
    namespace = service["metadata"]["namespace"]
    assert service["spec"]["ports"][0]["port"] == 80
    assert context.params["gateways"] == [f"http://{service['metadata']['name']}.{namespace}.svc"]


def test_hpa_pdb_and_service_select_and_scale_the_pods(rendered: list[dict[str, Any]]) -> None:
    deployment = by_kind(rendered, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert "replicas" not in deployment["spec"]  # the HPA's to set
    assert by_kind(rendered, "Service")["spec"]["selector"].items() <= labels.items()
    pdb = by_kind(rendered, "PodDisruptionBudget")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb == {**pdb, "maxUnavailable": 1} and "minAvailable" not in pdb
    hpa = by_kind(rendered, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["minReplicas"] >= 2  # one eviction (the PDB) still leaves one serving


def test_the_hpa_metric_has_a_complete_path() -> None:
    """gauge (the gateway) → series (Prometheus) → custom metric (prometheus-adapter's rule) →
    HPA; or gauge → KEDA's Prometheus trigger."""
    hpa = yaml.safe_load((K8S / "hpa.yaml").read_text())
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric in Metrics().registry._names_to_collectors  # the gauge the gateway exports
    values = yaml.safe_load((K8S / "autoscaling" / "prometheus-adapter.values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert metric in rule["seriesQuery"]
    assert re.fullmatch(rule["name"]["matches"], metric) and rule["name"]["as"] == metric
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert "<<.GroupBy>>" in rule["metricsQuery"]  # one value per pod
    keda = yaml.safe_load((K8S / "autoscaling" / "keda.yaml").read_text())
    (trigger,) = keda["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and metric in trigger["metadata"]["query"]
    assert keda["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]


# --- the image -----------------------------------------------------------------------------


def dockerfile() -> DockerfileParser:
    return DockerfileParser(path=str(ROOT / "Dockerfile"))


def stages() -> list[list[dict[str, Any]]]:
    found: list[list[dict[str, Any]]] = []
    for instruction in dockerfile().structure:
        if instruction["instruction"] == "FROM":
            found.append([])
        if found and instruction["instruction"] != "COMMENT":
            found[-1].append(instruction)
    return found


def build_args(stage: list[dict[str, Any]]) -> dict[str, str]:
    """The stage's ARG defaults (``ARG NAME=value``; quotes removed)."""
    args = {}
    for instruction in stage:
        if instruction["instruction"] == "ARG" and "=" in instruction["value"]:
            name, _, value = instruction["value"].partition("=")
            args[name.strip()] = value.strip().strip('"')
    return args


def image_env() -> dict[str, str]:
    """GATEWAY_* defaults the runtime image sets (its last stage's ENV, build args at their
    defaults, i.e. the NGC image's)."""
    runtime = stages()[-1]
    text = " ".join(i["value"] for i in runtime if i["instruction"] == "ENV")
    for name, value in build_args(runtime).items():
        text = text.replace(f"${{{name}}}", value)
    return dict(re.findall(r"\b(GATEWAY_[A-Z_]+)=(\S+)", text))


def test_hadolint_passes_and_would_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    hadolint = tool("hadolint")
    config = str(ROOT / ".hadolint.yaml")
    result = run(hadolint, "--config", config, "--no-color", str(ROOT / "Dockerfile"))
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN cd /tmp && apt-get install curl\n")
    assert run(hadolint, "--config", config, str(bad)).returncode != 0


def test_the_runtime_image(monkeypatch: pytest.MonkeyPatch) -> None:
    *_, runtime = stages()

    def values(name: str) -> list[str]:
        return [i["value"] for i in runtime if i["instruction"] == name]

    (user,) = values("USER")
    assert user.split(":")[0] == "10001"  # numeric: runAsNonRoot can verify it
    assert values("EXPOSE") == [str(PORT)]
    (entrypoint,) = values("ENTRYPOINT")
    chain = json.loads(entrypoint)
    assert chain[0] == "/usr/bin/tini"  # an init reaps orphans
    # NGC's entrypoint script (CUDA forward compatibility on older drivers) runs before anything
    # loads CUDA, and execs the supervisor
    assert chain[2:] == [
        "/opt/nvidia/nvidia_entrypoint.sh",
        "/opt/venv/bin/clip-gateway-entrypoint",
    ]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "clip-gateway-entrypoint" in entrypoint
    assert scripts["clip-gateway-entrypoint"] == "clip_gateway.launcher.supervisor:main"
    assert any("/var/cache/clip-gateway" in v for v in values("VOLUME"))
    for name in image_env():
        assert name in KNOWN_ENV, name
    # without a GPU `auto` picks cpu, which must run on what the image has
    assert image_env()["GATEWAY_TRITON_CPU_BACKEND"] == "onnxruntime"
    (healthcheck,) = values("HEALTHCHECK")
    assert f"127.0.0.1:{PORT}/healthz" in healthcheck
    start_period = int(re.search(r"--start-period=(\d+)s", healthcheck).group(1))  # type: ignore[union-attr]
    derived = timings.derive(settings_under({}, monkeypatch))
    assert start_period >= derived.healthcheck_start_period_s
    # build tools stay in the build stage
    installs = " ".join(values("RUN"))
    assert "build-essential" not in installs and "-dev" not in installs
    assert any("COPY --from=venv" in i["content"] for i in runtime)
    assert any("COPY --from=export" in i["content"] for i in runtime)


def test_the_export_stage_installs_the_locks_versions() -> None:
    """The export runs with the versions it was validated with: the export extra constrained by
    requirements/lock.txt, torch from an index of +cpu builds of the lock's version by default."""
    export = stages()[0]
    runs = [i["value"] for i in export if i["instruction"] == "RUN"]
    (install,) = [run for run in runs if "pip install" in run]
    assert "-c requirements/lock.txt" in install and '"export"' in install
    assert build_args(export)["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    # the lock's interpreter (`make lock`: --python-version 3.11) is the export base's
    lock_python = re.search(r"--python-version (\S+)", (ROOT / "Makefile").read_text())
    assert lock_python is not None
    assert f"python:{lock_python.group(1)}-" in (ROOT / "Dockerfile").read_text()


def copied_before(stage: list[dict[str, Any]], marker: str) -> set[str]:
    """Sources of the COPY instructions above the first RUN containing ``marker``."""
    sources: set[str] = set()
    for instruction in stage:
        if instruction["instruction"] == "RUN" and marker in instruction["value"]:
            return sources
        if instruction["instruction"] == "COPY":
            *paths, _dest = [w for w in instruction["value"].split() if not w.startswith("--")]
            if "--from" in instruction["value"]:
                paths = [f"(stage) {p}" for p in paths]
            sources.update(paths)
    raise AssertionError(f"no RUN with {marker!r}")


def test_source_edits_do_not_rebuild_the_export_or_pillow_simd() -> None:
    """Each expensive layer sees only the files its result depends on, so a README or gateway
    edit reuses the cached export and pillow-simd build."""
    from clip_gateway.model.spec import _VERSIONED_SOURCES

    export, venv, _runtime = stages()
    for_export = copied_before(export, "python -m clip_gateway.export")
    assert for_export <= {"clip_gateway/export/", "clip_gateway/__init__.py", "clip_gateway/model/",
                          "clip_gateway/text/",
                          "pyproject.toml", "requirements/lock.txt"}, for_export  # fmt: skip
    # the dependencies come from pyproject.toml and the lock alone, before any source file
    assert copied_before(export, "pip install") <= {"pyproject.toml", "requirements/lock.txt"}
    for source in _VERSIONED_SOURCES:  # everything that decides the exported bytes is there
        assert any(source.startswith(path) for path in for_export), source
    assert copied_before(venv, "pillow-simd") <= {"pyproject.toml", "requirements/lock.txt"}


# --- compose and nginx ---------------------------------------------------------------------


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    return doc


def interpolate(value: Any, shell: dict[str, str] | None = None) -> str:
    """Compose's ``${NAME}`` / ``${NAME:-default}`` substitution, from ``shell``."""
    shell = shell or {}

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3) or ""
        return shell.get(name) or default

    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", one, str(value))


@pytest.mark.slow
def test_compose_files_follow_the_compose_specification(tmp_path: Path) -> None:
    checker = tool("check-jsonschema")
    files = [
        str(COMPOSE / "docker-compose.yml"),
        str(ROOT / "deploy/observability/docker-compose.yml"),
    ]
    result = run(checker, "--builtin-schema", "vendor.compose-spec", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = compose()
    broken["services"]["lb"]["stop_grace_period"] = {"seconds": 60}
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    result = run(checker, "--builtin-schema", "vendor.compose-spec", str(tmp_path / "broken.yml"))
    assert result.returncode != 0  # the schema does reject


def seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smh])", duration))


def test_compose_gateways(monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose()["services"]
    gateways = {name: s for name, s in services.items() if name.startswith("gateway-")}
    devices = [
        s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for s in gateways.values()
    ]
    assert sorted(d[0] for d in devices) == [str(i) for i in range(len(gateways))]
    assert len({s["volumes"][0] for s in gateways.values()}) == len(gateways)  # cache per GPU
    for service in gateways.values():  # a CPU share per gateway, which its plan then reads
        assert interpolate(service["cpus"]) == "0"  # Docker's "no limit" unless set
        assert interpolate(service["cpus"], {"CLIP_GATEWAY_CPUS": "8"}) == "8"
    for service in gateways.values():
        assert set(service["environment"]) <= KNOWN_ENV | {"OTEL_EXPORTER_OTLP_ENDPOINT"}
        env = {
            k: interpolate(v) for k, v in service["environment"].items() if k.startswith("GATEWAY_")
        }
        derived = timings.derive(settings_under(env, monkeypatch))
        assert derived.problems() == []
        # Docker's default is 10 s: far less than a drain
        assert seconds(service["stop_grace_period"]) >= derived.stop_s + timings.HEADROOM_S
    lb = services["lb"]
    (published,) = lb["ports"]
    assert interpolate(published) == f"127.0.0.1:{PORT}:{PORT}"  # this host only, by default
    assert interpolate(published, {"CLIP_GATEWAY_PUBLISH": "0.0.0.0"}) == f"0.0.0.0:{PORT}:{PORT}"
    assert all(c["condition"] == "service_healthy" for c in lb["depends_on"].values())
    assert lb["stop_signal"] == "SIGQUIT"  # nginx's graceful stop


def test_compose_gateways_require_an_api_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The key file is a compose secret (git-ignored, made by `make api-key`); without a key
    in it a gateway refuses to start, unless GATEWAY_ANONYMOUS=true is set explicitly."""
    doc = compose()
    (source,) = doc["secrets"].values()
    name = next(iter(doc["secrets"]))
    ignored = run("git", "check-ignore", "-q", str(COMPOSE / source["file"]), cwd=ROOT)
    assert ignored.returncode == 0, "the key file must never be committed"
    makefile = (ROOT / "Makefile").read_text()
    assert f"KEYS_FILE := deploy/compose/{Path(source['file'])}" in makefile
    keys = tmp_path / "api-keys"
    for service in (s for n, s in doc["services"].items() if n.startswith("gateway-")):
        assert service["secrets"] == [name]
        environment = service["environment"]
        assert environment["GATEWAY_API_KEYS_FILE"] == f"/run/secrets/{name}"
        keys.write_text("")

        def server(shell: dict[str, str], environment: dict[str, Any] = environment) -> Any:
            env = {k: interpolate(v, shell) for k, v in environment.items()}
            env["GATEWAY_API_KEYS_FILE"] = str(keys)
            return settings_under(env, monkeypatch).server

        assert exposure_problem(server({})) is not None
        assert exposure_problem(server({"GATEWAY_ANONYMOUS": "true"})) is None
        keys.write_text("k-1\n")
        assert exposure_problem(server({})) is None


def nginx_directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (COMPOSE / "nginx.conf").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.endswith(";"):
            name, _, value = line[:-1].partition(" ")
            found.setdefault(name, []).append(value.strip())
    return found


def test_nginx_t_accepts_the_config(tmp_path: Path) -> None:
    """`nginx -t` resolves the upstream names, which exist only on compose's network: it runs
    in a mount namespace of its own whose /etc/hosts has them (root: CI)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists() or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI must run nginx -t: .ci/run installs nginx and runs as root")
        pytest.skip("needs nginx (apt-get install nginx) and root")
    upstreams = [v.split()[0].split(":")[0] for v in nginx_directives()["server"]]
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost {' '.join(upstreams)}\n")
    test = (
        f"{nginx} -t -c {COMPOSE / 'nginx.conf'} -p {tmp_path} -e stderr -g 'pid {tmp_path}/pid;'"
    )
    result = run("unshare", "--mount", "--fork", "sh", "-c",
                 f"mount --bind {hosts} /etc/hosts && {test}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
    broken = tmp_path / "broken.conf"
    broken.write_text((COMPOSE / "nginx.conf").read_text().replace("least_conn;", "least_con;"))
    test = test.replace(str(COMPOSE / "nginx.conf"), str(broken))
    result = run("unshare", "--mount", "--fork", "sh", "-c",
                 f"mount --bind {hosts} /etc/hosts && {test}")  # fmt: skip
    assert result.returncode != 0  # nginx -t does reject


def test_nginx_retries_what_is_safe_and_mirrors_the_gateway() -> None:
    directives = nginx_directives()
    server = ServerSettings()
    (retry,) = directives["proxy_next_upstream"]
    assert {"error", "timeout", "non_idempotent"} <= set(retry.split())  # POSTs too
    # a retried status counts towards max_fails: a surviving gateway's load-shedding 503s would
    # mark it down while the other restarts (every request then 502)
    assert not any(word.startswith("http_") for word in retry.split())
    assert seconds(directives["proxy_next_upstream_timeout"][0]) < server.request_timeout_s
    assert directives["worker_processes"] == ["auto"]
    # 700 clients hold 1,400 connections (client + upstream): room for many more per worker
    assert int(directives["worker_connections"][0]) >= 4 * 700
    assert directives["server"] == [f"gateway-{i}:{PORT} max_fails=3 fail_timeout=10s"
                                    for i in range(len(directives["server"]))]  # fmt: skip
    assert directives["client_max_body_size"] == [f"{server.max_body_bytes >> 20}m"]
    assert seconds(directives["client_body_timeout"][0]) == server.body_timeout_s
    assert seconds(directives["proxy_read_timeout"][0]) > server.request_timeout_s
    # below uvicorn's idle keep-alive (its default, 5 s): never reuse a closing connection
    assert seconds(directives["keepalive_timeout"][0]) < 5


# --- docs/DEPLOY.md's table ----------------------------------------------------------------


def documented_timings() -> dict[str, list[str]]:
    """docs/DEPLOY.md's Timings table: row name → cells (make serve, compose, Kubernetes)."""
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    section = text.split("\n## Timings\n", 1)[1]
    table = next(block for block in section.split("\n\n") if block.startswith("|"))
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0]: row[2:] for row in rows}


def test_the_documented_timings_table_is_what_each_deployment_derives(
    pod: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    (gateway, *_) = [s for n, s in compose()["services"].items() if n.startswith("gateway-")]
    environments = [
        {},  # make serve: the defaults
        {k: interpolate(v) for k, v in gateway["environment"].items() if k.startswith("GATEWAY_")},
        container_env(pod),
    ]
    rows = {
        "stop delay": "stop_delay_s",
        "drain": "drain_s",
        "gateway exit deadline": "gateway_stop_s",
        "Triton grace": "triton_grace_s",
        "worst-case stop": "stop_s",
        "orchestrator's kill": "kill_after_s",
        "start-up budget": "startup_timeout_s",
        "start-up allowance": "healthcheck_start_period_s",
        "`/readyz` probe timeout": "readiness_timeout_s",
    }
    table = documented_timings()
    assert set(table) == set(rows)
    for column, env in enumerate(environments):
        derived = timings.derive(settings_under(env, monkeypatch))
        for row, field in rows.items():
            cell = table[row][column]
            if cell != "–":
                assert float(cell.split()[0]) == getattr(derived, field), (row, column)
