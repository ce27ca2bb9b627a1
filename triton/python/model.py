"""Triton Python-backend model for the `cpu` profiles: the exported ONNX graph on ORT's CPU EP;
(``execution_provider: cuda``, the ``cuda`` profile where Triton has no onnxruntime backend) on
ORT's CUDA EP; or (``runtime: openvino``, the ``cpu-bf16`` profile) on OpenVINO's CPU plugin at
the inference precision the config names (``bf16``: the weights stay FP32 in the file, OpenVINO
runs the matrix products in BF16 on AVX-512 BF16 / AMX units); the ``cpu-int8-openvino``
profile's file is OpenVINO IR quantized by NNCF, the precision then that of the operations it left
unquantized.

Runs inside Triton's python backend stub (triton/README.md explains the interpreter it uses). The
dynamic batcher hands `execute` several requests at once; they are concatenated into one ORT run
and split again, so batching across gateway requests actually reaches the model.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        path = os.path.join(
            args["model_repository"], args["model_version"], params.get("onnx_file", "model.onnx")
        )
        threads = int(params.get("intra_op_threads", "0") or 0)
        self.runtime = params.get("runtime", "onnxruntime")
        if self.runtime == "openvino":
            self.run = self._openvino(path, threads, params.get("inference_precision", "f32"))
            return
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        # nodes run one after another (ORT's default sequential mode): no inter-op pool needed
        options.inter_op_num_threads = int(params.get("inter_op_threads", "1") or 1)
        # idle intra-op threads spin-wait for the next op by default, burning the cores the
        # gateway decodes on; the core plan turns it off (clip_gateway/config/plan.py)
        spinning = params.get("allow_spinning", "1")
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        providers = self._providers(params, args)
        session = ort.InferenceSession(path, options, providers=providers)
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        if session.get_providers()[0] != wanted:
            # ORT falls back to the CPU silently when the CUDA EP cannot load (no onnxruntime-gpu,
            # a CUDA or cuDNN library missing): a GPU profile must not serve from the CPU
            active = session.get_providers()
            raise RuntimeError(f"{wanted} did not load (ONNX Runtime runs {active})")
        self.run = lambda batch: session.run([self.output_name], {self.input_name: batch})[0]

    @staticmethod
    def _providers(params, args):
        """The CPU EP, or (``execution_provider: cuda``, the ``cuda`` profile on the Python
        backend) the CUDA EP on the device Triton gave this instance, with cuda.pbtxt's options."""
        if params.get("execution_provider", "cpu") != "cuda":
            return ["CPUExecutionProvider"]
        options = {
            "device_id": int(args.get("model_instance_device_id", "0") or 0),
            "cudnn_conv_algo_search": params.get("cudnn_conv_algo_search", "HEURISTIC"),
            "enable_cuda_graph": params.get("enable_cuda_graph", "0"),
        }
        return [("CUDAExecutionProvider", options)]

    def _openvino(self, path, threads, precision):
        import openvino as ov

        config = {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY",
                  "NUM_STREAMS": 1}  # fmt: skip
        if threads > 0:
            config["INFERENCE_NUM_THREADS"] = threads
        compiled = ov.Core().compile_model(path, "CPU", config)
        got = compiled.get_property("INFERENCE_PRECISION_HINT")
        if got != getattr(ov.Type, precision):
            # OpenVINO silently runs f32 where the CPU lacks BF16: that is not what was asked for
            raise RuntimeError(f"OpenVINO runs this model at {got}, not the {precision} asked for")
        request = compiled.create_infer_request()
        # each model instance runs one batch at a time: one infer request is enough
        return lambda batch: request.infer({0: batch})[0].copy()

    def execute(self, requests):
        arrays = [
            pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            for request in requests
        ]
        try:
            batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            embeddings = self.run(batch)
        except Exception as exc:  # report it on every request of the batch instead of crashing
            error = pb_utils.TritonError(f"{self.runtime} failed: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        responses = []
        start = 0
        for array in arrays:
            end = start + len(array)
            tensor = pb_utils.Tensor(self.output_name, np.ascontiguousarray(embeddings[start:end]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start = end
        return responses
