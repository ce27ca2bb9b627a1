"""triton/python/model.py's request to the CUDA driver that a thread waiting for the GPU sleep
(blocking sync) rather than spin on a core. This machine has no CUDA driver: the absent library is
the real one here, and the driver's side is a stand-in that keeps what it was asked (the lent GPU
host reads the flag back from the context ONNX Runtime created: ``clip_cuda_blocking_sync``)."""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

MODEL_PY = Path(__file__).parents[3] / "triton" / "python" / "model.py"


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Any:
    """model.py as the Python backend's stub loads it (its utilities module is the stub's own:
    an empty stand-in, which these functions never touch)."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb"))
    spec = importlib.util.spec_from_file_location("clip_triton_model", MODEL_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Driver:
    """The CUDA driver calls model.py makes, answering ``fail`` (call name: CUresult) or 0, and
    keeping each primary context's flags."""

    NAMES: ClassVar[dict[int, bytes]] = {
        100: b"CUDA_ERROR_NO_DEVICE",
        101: b"CUDA_ERROR_INVALID_DEVICE",
    }

    def __init__(self, devices: int = 2, fail: dict[str, int] | None = None) -> None:
        self.devices, self.fail = devices, fail or {}
        self.calls: list[str] = []
        self.flags: dict[int, int] = {}

    def _answer(self, name: str) -> int:
        self.calls.append(name)
        return self.fail.get(name, 0)

    def cuInit(self, flags: int) -> int:
        assert flags == 0
        return self._answer("cuInit")

    def cuDeviceGet(self, device: Any, ordinal: int) -> int:
        if ordinal >= self.devices:
            self.calls.append("cuDeviceGet")
            return 101
        device._obj.value = 1000 + ordinal  # the handle is not the ordinal
        return self._answer("cuDeviceGet")

    def cuDevicePrimaryCtxSetFlags_v2(self, device: ctypes.c_int, flags: int) -> int:
        failed = self._answer("cuDevicePrimaryCtxSetFlags_v2")
        if not failed:
            self.flags[device.value] = flags
        return failed

    def cuDevicePrimaryCtxGetState(self, device: ctypes.c_int, flags: Any, active: Any) -> int:
        flags._obj.value = self.flags.get(device.value, 0) | 0x08  # CU_CTX_MAP_HOST beside
        active._obj.value = 1
        return self._answer("cuDevicePrimaryCtxGetState")

    def cuGetErrorName(self, error: int, name: Any) -> int:
        name._obj.value = self.NAMES.get(error)
        return 0 if error in self.NAMES else 1


def test_sets_blocking_sync_on_the_instances_device_and_reads_it_back(model: Any) -> None:
    driver = Driver()
    assert model.blocking_sync(1, driver) is None
    assert driver.calls == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxSetFlags_v2"]
    assert driver.flags == {1001: model.BLOCKING_SYNC}  # device 1's handle, not device 0's
    assert model.sync_flags(1, driver) == (model.BLOCKING_SYNC, None)
    # a context left to CUDA's default (auto: spin when cores outnumber contexts) reads 0
    assert model.sync_flags(0, driver) == (0, None)


@pytest.mark.parametrize(
    ("fail", "device", "why"),
    [
        ({"cuInit": 100}, 0, "cuInit: CUDA_ERROR_NO_DEVICE"),
        ({}, 5, "cuDeviceGet: CUDA_ERROR_INVALID_DEVICE"),
        ({"cuDevicePrimaryCtxSetFlags_v2": 7}, 0, "cuDevicePrimaryCtxSetFlags: error 7"),
    ],
)
def test_a_refusal_names_the_call_and_the_error_and_sets_nothing(
    model: Any, fail: dict[str, int], device: int, why: str
) -> None:
    driver = Driver(fail=fail)
    assert model.blocking_sync(device, driver) == why
    assert driver.flags == {}
    assert driver.calls[-1].startswith(why.split(":")[0])  # nothing asked after the refusal


def test_without_a_cuda_driver_it_says_so(model: Any) -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has a CUDA driver")
    assert "libcuda.so.1" in model.blocking_sync(0)
    flags, why = model.sync_flags(0)
    assert flags is None and "libcuda.so.1" in why
