"""Triton Python-backend model for the `cpu` profiles: the exported ONNX graph on ORT's CPU EP;
(``execution_provider: cuda``, the ``cuda`` profile where Triton has no onnxruntime backend) on
ORT's CUDA EP; or (``runtime: openvino``, the ``cpu-bf16`` profile) on OpenVINO's CPU plugin at
the inference precision the config names (``bf16``: the weights stay FP32 in the file, OpenVINO
runs the matrix products in BF16 on AVX-512 BF16 / AMX units); the ``cpu-int8-openvino``
profile's file is OpenVINO IR quantized by NNCF, the precision then that of the operations it left
unquantized.

Runs inside Triton's python backend stub (triton/README.md explains the interpreter it uses). The
dynamic batcher hands `execute` several requests at once; they become one run of the engine and
are split again, so batching across gateway requests actually reaches the model.

Each batch is copied at most once on its way to the engine. Triton has already put every
request's input in the shared memory it shares with this process; a batch of one request is
read there as it lies, the requests of a larger batch are copied once into a buffer this instance
keeps (``BatchBuffer``: sized to ``max_batch_size``, page-aligned, reused by every call). On the
CUDA EP that buffer is page-locked (``cudaHostRegister`` on the CUDA runtime the EP loaded) and
every batch goes through it, so ONNX Runtime's host-to-device copy is a DMA from it and not a copy
through the driver's staging buffer; where it cannot be locked the instance says so once in
Triton's log and runs from pageable memory. ONNX Runtime reads the input and writes the
embeddings through an IOBinding (no copy of the input into an ORT tensor, the output written into
the array the responses slice); OpenVINO reads the input in place (``share_inputs``). The bytes
copied into the buffer are counted in Triton's metrics (``COPIED_METRIC``), beside whether the
buffer is page-locked (``PINNED_METRIC``).

On the CUDA EP the instance also asks the CUDA driver, before ONNX Runtime creates its context, to
let a thread that waits for the GPU sleep until the GPU is done (``blocking_sync``). CUDA's default
on a host with more cores than contexts is to spin: every ``run`` would hold a core for as long as
the GPU computes, cores the host's gateway decodes on. Whether it took is the metric
``SYNC_METRIC``, read back from the context ORT created.
"""

import ctypes
import json
import mmap
import os

import numpy as np
import triton_python_backend_utils as pb_utils

#: Triton metric (its /metrics, per model instance): input bytes copied into the batch buffer.
#: Divided by Triton's own inference count and the row size, it is the copies per image: 0 for
#: batches of one request, 1 for merged ones.
COPIED_METRIC = "clip_batch_copied_bytes"
#: Triton metric (per model instance): 1 when the batch buffer is page-locked for the CUDA EP.
PINNED_METRIC = "clip_batch_buffer_pinned"
#: Triton metric (per model instance): 1 when the CUDA EP's context waits for the GPU asleep.
SYNC_METRIC = "clip_cuda_blocking_sync"
#: cudaHostRegisterPortable: locked for every CUDA context, whichever device the EP runs on.
_PORTABLE = 1
#: cuda.h: CU_CTX_SCHED_BLOCKING_SYNC, and the mask of the CU_CTX_SCHED_* flags.
BLOCKING_SYNC, SCHED_MASK = 0x04, 0x07


class BatchBuffer:
    """The rows of one batch, contiguous: one request's input where it lies, or the requests'
    inputs copied once into an array kept for every call (``max_batch_size`` rows, on pages of
    its own so that they can be page-locked)."""

    def __init__(self, rows, row_shape, dtype):
        self.row_bytes = int(np.prod(row_shape)) * np.dtype(dtype).itemsize
        self._pages = mmap.mmap(-1, rows * self.row_bytes)
        self.array = np.frombuffer(self._pages, dtype).reshape(rows, *row_shape)

    @property
    def address(self):
        return self.array.ctypes.data

    @property
    def nbytes(self):
        return self.array.nbytes

    def gather(self, arrays, *, always=False):
        """The batch and the bytes copied to make it: ``arrays[0]`` itself when it is the only
        one (unless ``always``: the CUDA EP's DMA wants the locked pages)."""
        if len(arrays) == 1 and not always and arrays[0].flags.c_contiguous:
            return arrays[0], 0
        rows = sum(len(array) for array in arrays)
        if rows > len(self.array):  # never from Triton's batcher (max_batch_size bounds it)
            batch = np.concatenate(arrays)
            return batch, batch.nbytes
        start = 0
        for array in arrays:
            self.array[start : start + len(array)] = array
            start += len(array)
        return self.array[:rows], rows * self.row_bytes


def cuda_runtime():
    """The CUDA runtime library ONNX Runtime's CUDA EP loaded into this process (the same one its
    copies use), from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    if not paths:
        raise OSError("no libcudart is loaded in this process")
    # one in practice (the CUDA EP's); were two loaded, the higher version: the kit carries
    # the CUDA 13 build of onnxruntime-gpu
    library = ctypes.CDLL(max(paths))
    library.cudaGetErrorString.restype = ctypes.c_char_p
    library.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    library.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    return library


def page_lock(buffer, device_id):
    """Page-lock ``buffer``'s pages for DMA; the runtime to unlock them with, or why not."""
    try:
        cudart = cuda_runtime()
    except OSError as exc:
        return None, str(exc)
    for name, call in (
        ("cudaSetDevice", lambda: cudart.cudaSetDevice(device_id)),
        ("cudaHostRegister", lambda: cudart.cudaHostRegister(buffer.address, buffer.nbytes,
                                                             _PORTABLE)),
    ):  # fmt: skip
        failed = call()
        if failed:
            return None, f"{name}: {cudart.cudaGetErrorString(failed).decode()}"
    return cudart, None


def cuda_driver():
    """The CUDA driver API (libcuda, which every CUDA runtime sits on)."""
    library = ctypes.CDLL("libcuda.so.1")
    library.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return library


def _driver_calls(driver, calls):
    """Run ``(name, call)`` in order: None when every one returned CUDA_SUCCESS, else the first
    failure as ``name: CUDA_ERROR_...``."""
    for name, call in calls:
        failed = call()
        if failed:
            text = ctypes.c_char_p()
            driver.cuGetErrorName(failed, ctypes.byref(text))
            return f"{name}: {(text.value or b'error %d' % failed).decode()}"
    return None


def blocking_sync(device_id, driver=None):
    """Set the scheduling flag of ``device_id``'s primary context (the context ONNX Runtime's
    CUDA EP runs in: the runtime API uses it) to CU_CTX_SCHED_BLOCKING_SYNC: a thread waiting
    for the GPU sleeps in the driver instead of spinning on a core. None when set, else why not.
    Call before the session exists; ``_v2`` also takes a context already active."""
    try:
        driver = driver or cuda_driver()
    except OSError as exc:
        return str(exc)
    device = ctypes.c_int()
    return _driver_calls(driver, (
        ("cuInit", lambda: driver.cuInit(0)),
        ("cuDeviceGet", lambda: driver.cuDeviceGet(ctypes.byref(device), device_id)),
        ("cuDevicePrimaryCtxSetFlags",
         lambda: driver.cuDevicePrimaryCtxSetFlags_v2(device, BLOCKING_SYNC)),
    ))  # fmt: skip


def sync_flags(device_id, driver=None):
    """``device_id``'s primary context scheduling flags (CU_CTX_SCHED_*), or why unknown."""
    try:
        driver = driver or cuda_driver()
    except OSError as exc:
        return None, str(exc)
    device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    why = _driver_calls(driver, (
        ("cuDeviceGet", lambda: driver.cuDeviceGet(ctypes.byref(device), device_id)),
        ("cuDevicePrimaryCtxGetState",
         lambda: driver.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags),
                                                   ctypes.byref(active))),
    ))  # fmt: skip
    return (None, why) if why else (flags.value & SCHED_MASK, None)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        tensor, output = config["input"][0], config["output"][0]
        self.input_name = tensor["name"]
        self.output_name = output["name"]
        self.output_dtype = pb_utils.triton_string_to_numpy(output["data_type"])
        self.output_dims = [int(d) for d in output["dims"]]
        self.buffer = BatchBuffer(
            max(1, int(config.get("max_batch_size", 0))),
            [int(d) for d in tensor["dims"]],
            pb_utils.triton_string_to_numpy(tensor["data_type"]),
        )
        self.always_gather = False
        self.cudart = None
        labels = {"model": args["model_name"], "instance": args["model_instance_name"]}
        # the families live as long as their metrics (Triton refuses a metric whose family is gone)
        self.families = (
            pb_utils.MetricFamily(
                name=COPIED_METRIC,
                description="input bytes copied into the batch buffer (triton/python/model.py)",
                kind=pb_utils.MetricFamily.COUNTER,
            ),
            pb_utils.MetricFamily(
                name=PINNED_METRIC,
                description="1 when the batch buffer is page-locked for the CUDA EP",
                kind=pb_utils.MetricFamily.GAUGE,
            ),
            pb_utils.MetricFamily(
                name=SYNC_METRIC,
                description="1 when the CUDA EP's context waits for the GPU asleep, not spinning",
                kind=pb_utils.MetricFamily.GAUGE,
            ),
        )
        self.copied = self.families[0].Metric(labels=labels)
        self.pinned = self.families[1].Metric(labels=labels)
        self.blocking = self.families[2].Metric(labels=labels)
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
        # gateway decodes on; the core plan turns it off (clip_gateway/profiles/plans.py)
        spinning = params.get("allow_spinning", "1")
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        providers = self._providers(params, args)
        wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
        device_id = int(args.get("model_instance_device_id", "0") or 0)
        asleep = wanted == "CUDAExecutionProvider" and params.get("cuda_blocking_sync") == "1"
        if asleep and (why := blocking_sync(device_id)):
            pb_utils.Logger.log_warn(f"CUDA context not set to blocking sync, {why}: a thread "
                                     "waiting for the GPU spins on a core")  # fmt: skip
        session = ort.InferenceSession(path, options, providers=providers)
        if session.get_providers()[0] != wanted:
            # ORT falls back to the CPU silently when the CUDA EP cannot load (no onnxruntime-gpu,
            # a CUDA or cuDNN library missing): a GPU profile must not serve from the CPU
            active = session.get_providers()
            raise RuntimeError(f"{wanted} did not load (ONNX Runtime runs {active})")
        if wanted == "CUDAExecutionProvider":
            self._page_lock(device_id)
            self._report_sync(device_id)
        self.session, self.binding = session, session.io_binding()
        self.run = self._onnxruntime

    def _page_lock(self, device_id):
        self.cudart, why = page_lock(self.buffer, device_id)
        size = f"{self.buffer.nbytes / 2**20:.1f} MiB"
        if self.cudart is None:
            pb_utils.Logger.log_warn(
                f"{self.input_name} batch buffer ({size}) not page-locked, {why}: host-to-device "
                "copies go through the CUDA driver's staging buffer"
            )
            return
        # every batch through the locked pages: one copy there, then a DMA to the device
        self.always_gather = True
        self.pinned.set(1)
        pb_utils.Logger.log_info(f"{self.input_name} batch buffer page-locked ({size})")

    def _report_sync(self, device_id):
        """How the context ORT runs in waits for the GPU: the metric, and a line in the log."""
        flags, why = sync_flags(device_id)
        if flags is None:
            pb_utils.Logger.log_warn(f"CUDA context scheduling unknown: {why}")
            return
        asleep = flags == BLOCKING_SYNC
        self.blocking.set(1 if asleep else 0)
        how = "blocking sync" if asleep else "not blocking: a wait for the GPU may spin"
        pb_utils.Logger.log_info(f"CUDA context scheduling flags {flags:#x} ({how})")

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

    def _onnxruntime(self, batch):
        """One ORT run through the IOBinding: the input read where it lies (ORT copies it to the
        device itself on the CUDA EP), the embeddings written into the array returned."""
        out = np.empty((len(batch), *self.output_dims), self.output_dtype)
        self.binding.bind_input(self.input_name, "cpu", 0, batch.dtype.type, batch.shape,
                                batch.ctypes.data)  # fmt: skip
        self.binding.bind_output(self.output_name, "cpu", 0, out.dtype.type, out.shape,
                                 out.ctypes.data)  # fmt: skip
        self.session.run_with_iobinding(self.binding)
        return out

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
        # each model instance runs one batch at a time: one infer request is enough. The input
        # is read where it lies; the output comes back as a copy of the request's own tensor,
        # which the next call overwrites (share_outputs=False)
        return lambda batch: request.infer({0: batch}, share_inputs=True)[0]

    def execute(self, requests):
        arrays = [
            pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            for request in requests
        ]
        try:
            batch, copied = self.buffer.gather(arrays, always=self.always_gather)
            embeddings = self.run(batch)
        except Exception as exc:  # report it on every request of the batch instead of crashing
            error = pb_utils.TritonError(f"{self.runtime} failed: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        if copied:
            self.copied.increment(copied)
        responses = []
        start = 0
        for array in arrays:
            end = start + len(array)
            # a view of the rows (contiguous): the stub copies it into the response's memory
            tensor = pb_utils.Tensor(self.output_name, embeddings[start:end])
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start = end
        return responses

    def finalize(self):
        if self.cudart is not None:
            self.cudart.cudaHostUnregister(self.buffer.address)
            self.cudart = None
