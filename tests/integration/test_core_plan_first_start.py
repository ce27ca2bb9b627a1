"""A CPU profile's first start on this machine, through the container entrypoint: the table's
core plan serves at once; in the background each candidate plan (1 x N, 2 x N/2) is timed in a
tritonserver of its own, the rule's choice is loaded into the serving Triton in place and kept
beside the export; /v1/models and the log name the plan and its figures; the next start serves
the kept plan at once, timing nothing. The rule and the record's signature are
tests/unit/profiles/test_planner.py's and tests/unit/profiles/test_plans.py's."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from clip_gateway.config import plan
from clip_gateway.model.contract import TRITON_MODEL_NAME
from clip_gateway.profiles import planner as core_plan
from clip_gateway.profiles import plans
from tests import samples
from tests.integration.test_int8 import launch, model_card  # noqa: F401

#: The background timing's budget: two candidates on 2 CPUs, a Triton start and a few rounds
#: each (the default, 60 s, gives each 30 s; a slow machine overruns it rather than fail).
BUDGET_S = 30


def linked_export(source: Path, into: Path) -> Path:
    """The export's files linked into a directory of this test's, so the record it keeps
    beside them is this test's alone (the session's other launches never see it). A plan
    recorded beside the source (it may be the user's cache, where ``make serve`` keeps one)
    is not linked: this is the first start."""
    into.mkdir()
    for path in source.iterdir():
        if path.name != core_plan.RECORD:
            (into / path.name).symlink_to(path)
    return into


def live_plan(scratch: Path) -> tuple[int, str]:
    """Instances and intra-op threads of the image tower Triton serves now."""
    (config_path,) = scratch.glob(
        f"clip-gateway-*/model_repository/{TRITON_MODEL_NAME}/config.pbtxt"
    )
    config = text_format.Parse(config_path.read_text(), mc.ModelConfig())
    return config.instance_group[0].count, config.parameters["intra_op_threads"].string_value


@pytest.mark.timeout(600)
def test_the_first_start_measures_the_plan_in_the_background_and_the_next_reuses_it(
    exported_int8,
    launch,  # noqa: F811
    tmp_path: Path,
) -> None:
    from clip_gateway.profiles import gpu

    if gpu.detect() is not None:
        pytest.skip("a GPU is present: the CPU profiles' plan is not what serves")
    export = linked_export(exported_int8.directory, tmp_path / "export")
    env = {"GATEWAY_MODEL_DIR": str(export), "GATEWAY_TRITON_PROFILE": "cpu-int8",
           "GATEWAY_PLAN_MEASURE_S": str(BUDGET_S)}  # fmt: skip
    served = launch(**env)
    served.wait_ready(timeout=300)
    log = served.log.read_text()
    assert "core plan 2 instance(s) x 1 thread(s) per tower (the table" in log  # cpu-int8's
    first = model_card(served.url)["quantization"]["image"]["core_plan"]
    assert "until measured here" in first["by"]
    started = time.monotonic()
    # loaded in place (the log says so), then seen by the gateway (it reads the configs again
    # every 10 s)
    while "loaded in place" not in served.log.read_text() or not (
        card := model_card(served.url)["quantization"]
    )["text"]["core_plan"]["by"].startswith("measured now"):
        assert time.monotonic() - started < 400, served.tail()
        assert served.process.poll() is None, served.tail()
        time.sleep(1)
    print(f"\nmeasured and loaded in {time.monotonic() - started:.0f} s")
    chosen = card["image"]["core_plan"]
    print(f"core plan on this machine: {json.dumps(chosen)}")
    assert card["text"]["core_plan"] == chosen  # both towers get the plan
    candidates = {p.name for p in plans.plan_candidates(plan.usable_cpus())}
    assert set(chosen["measured"]) | set(chosen["failed"]) == candidates
    figures = {plans.ModelPlan.parse(name): plans.PlanTiming(**found)
               for name, found in chosen["measured"].items()}  # fmt: skip
    rule, _ = plans.choose_model_plan(figures)  # the rule, applied to what it measured
    assert (chosen["instances"], chosen["threads"]) == (rule.instances, rule.threads)
    assert live_plan(tmp_path) == (rule.instances, str(rule.threads))
    log = served.log.read_text()
    assert f"core plan {rule.instances} instance(s) x {rule.threads} thread(s) per tower, " \
        "measured here: single image p50" in log  # fmt: skip
    files = [("image", ("0", samples.compact(0), "application/octet-stream"))]
    assert httpx.post(f"{served.url}/v1/embeddings", files=files, timeout=120).status_code == 200
    kept = json.loads((export / core_plan.RECORD).read_text())["plans"]["cpu-int8"]
    assert kept["plan"] == rule.name
    assert served.stop() == 0

    again = launch(**env)  # the same entrypoint, ports and export: measured here earlier
    again.wait_ready(timeout=300)
    log = again.log.read_text()
    assert "core plan: timing" not in log
    assert (
        f"measured here: single image p50 {kept['timings'][rule.name]['single_p50_ms']:.1f}" in log
    )
    card = model_card(again.url)["quantization"]["image"]["core_plan"]
    assert card["by"].startswith("measured here earlier")
    assert (card["instances"], card["threads"]) == (rule.instances, rule.threads)
