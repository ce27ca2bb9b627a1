# Appended by tests to a copy of triton/python/model.py (the cpu profile's real model): the model
# stays in `initialize` (Triton not READY, as during a long load or a TensorRT engine build)
# until the test creates HOLD_DIR/release, and says so by creating HOLD_DIR/initializing. A
# hold never lasts more than 600 s. HOLD_DIR is substituted by the test.
import time as _time
from pathlib import Path as _Path

_HOLD = _Path("HOLD_DIR")
_Real = TritonPythonModel  # noqa: F821 (defined by the model this is appended to)


class TritonPythonModel(_Real):
    def initialize(self, args):
        (_HOLD / "initializing").touch()
        started = _time.monotonic()
        while not (_HOLD / "release").exists() and _time.monotonic() - started < 600:
            _time.sleep(0.05)
        super().initialize(args)
