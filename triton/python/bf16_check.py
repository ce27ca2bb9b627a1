"""The ``cpu-bf16`` profile's quality-gate measurement, run in the Triton env's interpreter (the
one triton/python/model.py runs in, with ``openvino`` and ``onnxruntime``):

    python bf16_check.py EXPORT_DIR INPUTS.npz OUT.npz THREADS

For each array in INPUTS.npz (``image``: uint8 pixels, ``text``: int32 token ids), the tower's FP32
ONNX file run by ONNX Runtime (as the ``cpu`` profile runs it) and by OpenVINO at BF16 inference
precision (as model.py runs it for ``cpu-bf16``); OUT.npz holds ``fp32_<tower>`` and
``bf16_<tower>``. The launcher (clip_gateway/profiles/bf16.py) compares them against the gate.
Prints OpenVINO's version. A CPU on which OpenVINO would not run BF16 is an error,
never FP32 figures.
"""

import sys

import numpy as np
import onnxruntime as ort
import openvino as ov

FILES = {"image": "model.onnx", "text": "text.onnx"}
CHUNK = 16


def main(export_dir, inputs, out, threads):
    arrays = dict(np.load(inputs))
    threads = int(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    config = {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY",
              "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads}  # fmt: skip
    core = ov.Core()
    results = {}
    for tower, array in arrays.items():
        path = f"{export_dir}/{FILES[tower]}"
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        compiled = core.compile_model(path, "CPU", config)
        got = compiled.get_property("INFERENCE_PRECISION_HINT")
        if got != ov.Type.bf16:
            raise SystemExit(f"OpenVINO runs {FILES[tower]} at {got} on this CPU, not bf16")
        request = compiled.create_infer_request()
        chunks = [array[i : i + CHUNK] for i in range(0, len(array), CHUNK)]
        results[f"fp32_{tower}"] = np.concatenate([session.run(None, {name: c})[0] for c in chunks])
        results[f"bf16_{tower}"] = np.concatenate([request.infer({0: c})[0].copy() for c in chunks])
    np.savez(out, **results)
    print(ov.__version__.split("-")[0])


if __name__ == "__main__":
    main(*sys.argv[1:])
