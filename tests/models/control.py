"""A Triton Python-backend model for failure tests: the gateway's tensor contract, behaviour
chosen at run time through a small JSON control file (path in the config's ``control_file``).

Its embedding is the same cheap content-bound function as ``tests.fakes.FakeBackend`` (8x8 mean
pool, then a fixed closed-form projection; as ``clip_text``, waves of the token ids), which the
contract suite checks. Both models read the same control file. Control keys:

- ``mode``: ``ok`` | ``error`` (fail every request) | ``nan`` (NaN rows: a broken engine) |
  ``negate`` (wrong values: cosine -1 to the right ones);
- ``delay_s``: sleep before answering (a slow backend);
- ``hold``: while true, park each execute before answering; every execute first appends its
  batch size to ``<control_file>.arrivals``, so a test can wait until work has *reached* the
  model, then act, then release it. A hold never lasts longer than 120 s.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_HOLD_S = 120.0


def projection(embed_dim):
    rows = np.arange(1, 8 * 8 * 3 + 1, dtype=np.float64)[:, None]
    cols = np.arange(1, embed_dim + 1, dtype=np.float64)[None, :]
    return np.sin(rows * cols * 0.618034 + rows * 0.1)


def embed(pixels, projection):
    n, size = pixels.shape[0], pixels.shape[1]
    pooled = pixels.reshape(n, 8, size // 8, 8, size // 8, 3).mean(axis=(2, 4)).reshape(n, -1)
    return ((pooled / 255.0 - 0.5) @ projection).astype(np.float32)


def embed_tokens(tokens, embed_dim):
    cols = np.arange(1, embed_dim + 1, dtype=np.float64)[None, None, :]
    places = np.arange(tokens.shape[1], dtype=np.float64)[None, :, None]
    waves = np.sin(tokens.astype(np.float64)[:, :, None] * cols * 1e-3 + places * 0.37)
    return waves.mean(axis=1).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.control_file = params["control_file"]
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        self.embed_dim = int(config["output"][0]["dims"][-1])
        # clip_text's control model: token ids in (tests.fakes.embed_tokens)
        self.text = config["input"][0]["data_type"] == "TYPE_INT32"
        self.projection = projection(self.embed_dim)

    def control(self):
        try:
            with open(self.control_file) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def execute(self, requests):
        arrays = [
            pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests
        ]
        with open(self.control_file + ".arrivals", "a") as fh:
            fh.write("".join(f"{len(a)}\n" for a in arrays))
        control = self.control()
        started = time.monotonic()
        while control.get("hold") and time.monotonic() - started < MAX_HOLD_S:
            time.sleep(0.01)
            control = self.control()
        if control.get("delay_s"):
            time.sleep(float(control["delay_s"]))
        mode = control.get("mode", "ok")
        if mode == "error":
            error = pb_utils.TritonError("control model: failing on purpose")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        responses = []
        for array in arrays:
            if self.text:
                rows = embed_tokens(array, self.embed_dim)
            else:
                rows = embed(array, self.projection)
            if mode == "nan":
                rows[:] = np.nan
            elif mode == "negate":
                rows = -rows
            tensor = pb_utils.Tensor(self.output_name, np.ascontiguousarray(rows))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
