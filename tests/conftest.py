"""Fixtures shared by every test layer: one random-weights export and one real tritonserver."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clip_gateway.config.settings import RepositorySettings
from clip_gateway.launcher.repository import render

TESTS = Path(__file__).parent
#: The client suite runs in a client-only virtualenv (tests/integration/test_client_install.py);
#: the image suite needs the image (`make image`) and runs under `make image-test` only.
collect_ignore = ["client"] + ([] if os.environ.get("CLIP_GATEWAY_IMAGE_TEST") else ["image"])

if TESTS.parent.name == "mutants":  # `make mutation` runs the suite from its copy in mutants/
    # a mutant that a property test catches is caught at the first failing example; shrinking
    # it (minutes of examples) would only make mutmut count the kill as a timeout
    from hypothesis import Phase, settings

    settings.register_profile("mutation", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("mutation")
    # mutmut forks a child per mutant from a process that already ran the suite: torch's
    # OpenMP pool does not survive a fork (the open_clip reference hung in to_tensor, and
    # mutmut counted every such hang as a kill by timeout). One thread never starts the pool.
    import torch

    torch.set_num_threads(1)


#: Unit and API modules that import the export extra when imported (torch or open_clip: the
#: exporter, or open_clip's own pipeline as the reference; onnx or onnxruntime: graphs built and
#: run in the test): `make test-fast` does not collect them, `make test` marks their tests
#: ``torch``. A test that needs the export extra in a module not listed here carries
#: ``@pytest.mark.torch`` itself.
TORCH_MODULES = {
    "unit/model/test_calibration.py",
    "bench/test_bench_peers.py",
    "unit/export/test_graph.py",
    "unit/text/test_hf.py",
    "unit/export/test_model_family.py",
    "unit/imaging/test_preprocess_resize_modes.py",
    "unit/text/test_tokenizer.py",
    "api/test_texts.py",
}
#: What the fast tier makes unimportable, so that a test needing them fails there instead of
#: passing only because the full install happens to have them: the export extra's packages,
#: which a venv with the server, dev and bench extras lacks.
WITHOUT = ("torch", "torchvision", "open_clip", "onnx", "onnxruntime", "onnxscript",
           "transformers")  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier (make test-fast): leave out TORCH_MODULES (tests/conftest.py) and "
        "make the export extra (torch, open_clip, onnx, onnxruntime, ...) unimportable; pair "
        "with -m 'not torch'",
    )


class _Without:
    """A meta-path finder that refuses ``WITHOUT`` as if they were not installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in WITHOUT:
            raise ModuleNotFoundError(f"{name}: not in the fast tier (make test-fast)", name=name)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--fast"):
        sys.meta_path.insert(0, _Without())


def pytest_report_header(config: pytest.Config) -> str | None:
    if not config.getoption("--fast"):
        return None
    return "fast tier: left to `make test`: tests marked slow or torch, and " + ", ".join(
        sorted(TORCH_MODULES)
    )


#: A unit or API test that takes this long here (setup, call and teardown) is marked ``slow``:
#: the fast tier leaves it to `make test`, and names any unmarked one that takes longer.
SLOW_S = 1.0
_unmarked_slow: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "slow" not in report.keywords and "integration" not in report.keywords:
        _unmarked_slow[report.nodeid] = _unmarked_slow.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not config.getoption("--fast"):
        return
    over = sorted(
        ((seconds, name) for name, seconds in _unmarked_slow.items() if seconds >= 2 * SLOW_S),
        reverse=True,
    )
    if over:
        terminalreporter.section("unit and API tests over 2 s not marked slow")
        for seconds, name in over:
            terminalreporter.write_line(f"{seconds:5.1f} s {name}")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("--fast") and _relative(collection_path) in TORCH_MODULES:
        return True
    return None


def _relative(path: Path) -> str:
    try:
        return path.relative_to(TESTS).as_posix()
    except ValueError:
        return ""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (TESTS / "integration") in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)
        if _relative(Path(item.fspath)) in TORCH_MODULES:
            item.add_marker(pytest.mark.torch)


@pytest.fixture(scope="session")
def decode_speed_here() -> dict[str, float]:
    """This machine's decode speed per coding (pipeline/decode_speed.py), measured in this run:
    what a gateway started here prices decodes by. A test whose verdict rests on a decode's CPU
    time against its price uses it, never the factors alone: they were measured on another CPU
    (issue 42)."""
    from clip_gateway.pipeline import decode_speed

    return decode_speed.measure().speeds


@pytest.fixture(scope="session")
def exported():  # -> clip_gateway.model.spec.ExportedModel
    """ViT-B/32 with random weights (seed 0), FP32 + FP16, from the export cache when present
    (else exported in a child process: tests/exports.py)."""
    from clip_gateway.model.spec import Weights
    from tests.exports import ensure_exported

    return ensure_exported("ViT-B-32", Weights.random(0))


@pytest.fixture(scope="session")
def exported_int8(exported):  # -> clip_gateway.export.build.ExportedModel
    """The same export with its INT8 files and gate figures (``--int8``): only the tests that
    need INT8 ask for it, so CI quantizes (about a minute) only when they run."""
    from clip_gateway.model.spec import Weights
    from tests.exports import ensure_exported

    return ensure_exported("ViT-B-32", Weights.random(0), int8=True)


@pytest.fixture(scope="session")
def clip_tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """open_clip's CLIP BPE as the exporter writes it (clip_gateway/export/tokenizer.py), from the
    copy committed under tests/data/ (tests/tokenizer_data.py): no torch, no open_clip."""
    from tests.tokenizer_data import unpack

    return unpack(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def cpu_repository(exported, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("repo") / "model_repository"
    return render(RepositorySettings(profile="cpu"), exported.directory, out)


@pytest.fixture(scope="session")
def triton(cpu_repository: Path) -> Iterator[object]:
    """A real tritonserver (cpu profile) on free loopback ports, shared by the session."""
    from clip_gateway.launcher.local import LocalTriton

    with LocalTriton(cpu_repository) as server:
        yield server
