"""The ``cpu-int8-openvino`` profile's build and quality-gate measurement, run in the Triton env's
interpreter (the one triton/python/model.py runs in, with ``openvino``, ``nncf`` and
``onnxruntime``):

    python int8_openvino_build.py EXPORT_DIR CALIBRATION.npz GATE.npz OUT.npz THREADS REST

For each array in CALIBRATION.npz (``image``: uint8 pixels, ``text``: int32 token ids), the
tower's FP32 ONNX file quantized by NNCF's post-training quantization (its transformer preset,
SmoothQuant on the MatMuls at strength ``SMOOTH_QUANT``), calibrated on those inputs one item per
sample (the server's batches vary), saved as OpenVINO IR beside the export (``FILES``). Then on
GATE.npz (the gate's own set, not the one calibrated on) the FP32 file run by ONNX Runtime (as
the ``cpu`` profile runs it) and the IR by OpenVINO with REST (``bf16`` or ``f32``) as the
inference precision of the operations NNCF left unquantized (as model.py runs it); OUT.npz holds
``fp32_<tower>`` and ``int8_<tower>``. The launcher (clip_gateway/profiles/int8_openvino.py)
holds them to the gate. Prints OpenVINO's and NNCF's versions.
"""

import os
import sys

import numpy as np
import onnxruntime as ort
import openvino as ov

FILES = {"image": ("model.onnx", "model_int8_openvino.xml"),
         "text": ("text.onnx", "text_int8_openvino.xml")}  # fmt: skip
#: bench/results/openvino/nncf: alpha 0.3 kept ViT-B/32 nearest FP32 (min 0.999776 against
#: 0.999352 with NNCF's default) for 4 % of the speed
SMOOTH_QUANT = 0.3
CHUNK = 16


def quantize(core, path, samples):
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    advanced = AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=SMOOTH_QUANT)
    )
    dataset = nncf.Dataset([samples[i : i + 1] for i in range(len(samples))])
    return nncf.quantize(core.read_model(path), dataset, model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=len(samples), advanced_parameters=advanced)  # fmt: skip


def main(export_dir, calibration, gate, out, threads, rest):
    import nncf

    calibrating, checking = dict(np.load(calibration)), dict(np.load(gate))
    threads = int(threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    config = {"INFERENCE_PRECISION_HINT": rest, "PERFORMANCE_HINT": "LATENCY",
              "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads}  # fmt: skip
    core = ov.Core()
    results = {}
    for tower, array in checking.items():
        source, target = (f"{export_dir}/{name}" for name in FILES[tower])
        # written under a temporary name and renamed: a build ended half-way leaves no IR
        # that a later start would take for a finished one
        partial = target.replace(".xml", ".partial.xml")
        ov.save_model(quantize(core, source, calibrating[tower]), partial, compress_to_fp16=False)
        compiled = core.compile_model(partial, "CPU", config)
        got = compiled.get_property("INFERENCE_PRECISION_HINT")
        if got != getattr(ov.Type, rest):
            raise SystemExit(f"OpenVINO runs {FILES[tower][1]} at {got} here, not {rest}")
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        request = compiled.create_infer_request()
        chunks = [array[i : i + CHUNK] for i in range(0, len(array), CHUNK)]
        results[f"fp32_{tower}"] = np.concatenate([session.run(None, {name: c})[0] for c in chunks])
        results[f"int8_{tower}"] = np.concatenate([request.infer({0: c})[0].copy() for c in chunks])
        os.replace(partial.replace(".xml", ".bin"), target.replace(".xml", ".bin"))
        os.replace(partial, target)
    np.savez(out, **results)
    print(ov.__version__.split("-")[0], nncf.__version__)


if __name__ == "__main__":
    main(*sys.argv[1:])
