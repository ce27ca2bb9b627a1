# Two commands matter: `make serve` and `make test`. Everything else is what they are built from.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TRITON_ENV ?= .triton-env
PY := $(VENV)/bin/python
# `make serve`'s HOST, PORT, CLIP_MODEL, CLIP_WEIGHTS, CLIP_TOKENIZER and PROFILE are `clip-gateway
# serve`'s flags, passed only when set: unset, the GATEWAY_* environment variable holds, else the
# settings' default (`clip-gateway config`, docs/CONFIGURATION.md).
PORT ?=
# The model for `make serve`: any open_clip model name (`python -c "import open_clip;
# print(open_clip.list_models())"`), and its weights: a pretrained tag, a checkpoint path, or
# `random`. Another model needs its own weights, e.g. CLIP_MODEL=ViT-B-16-SigLIP CLIP_WEIGHTS=webli.
CLIP_MODEL ?=
CLIP_WEIGHTS ?=
# SigLIP, SigLIP2 and multilingual models tokenise texts with a Hugging Face tokenizer: the
# exporter fetches its files from the hub, or takes them from CLIP_TOKENIZER=<dir> offline
# (docs/MODELS.md). Unset and unreachable: the model serves images only.
CLIP_TOKENIZER ?=
# Triton profile: cpu | cpu-int8 | cpu-bf16 | cpu-int8-openvino | cuda | tensorrt | auto (GPU
# profiles need an NGC tritonserver; deploy/). cpu-int8: the INT8 graphs, quantized on first use and
# held to the quality gate. cpu-bf16: OpenVINO BF16 on CPUs with AVX-512 BF16/AMX, held to the same
# gate. cpu-int8-openvino: OpenVINO INT8, quantized by NNCF on first use, same gate. Unset: auto,
# which on a CPU host times the profiles that pass the gate once and serves the fastest
# (docs/PROFILES.md "auto on a CPU host"); on a GPU host, the GPU's profile.
PROFILE ?=
HOST ?=
# pillow-simd: Pillow's API with SIMD resampling (the resize is 5-8x faster here than stock
# Pillow's). It is a different distribution that owns the same `PIL` package, so it replaces
# Pillow once everything else is installed; torchvision (export extra) imports it unchanged.
# It builds against libjpeg/zlib/libwebp headers: requirements/pillow-simd.sh apt-installs them
# where it may (root or passwordless sudo), else stops and names them. PILLOW_SIMD=0 keeps stock
# Pillow.
PILLOW_SIMD ?= 1
PILLOW_SIMD_VERSION := 12.1.1.post0
SIMD_CFLAGS := $(shell grep -q avx2 /proc/cpuinfo 2>/dev/null && echo -mavx2)

.PHONY: install triton-env peer-env serve serve-export test test-fast check lint format typecheck pytest mutation lock \
  clean api-key image image-test compose-test kube-test gpu-kit

# The two environments and pillow-simd's wheel are built at once (they share nothing but uv),
# each environment by uv (requirements/uv.sh): one resolution, parallel downloads, exact pins from
# the lock.
install:
	@$(MAKE) -s --no-print-directory --output-sync=target -j3 $(VENV)/.installed $(TRITON_ENV)/.installed

# uv, the installer both environments are built with, inside the gateway's venv.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
$(UV):
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --quiet "uv==$(UV_VERSION)"

$(VENV)/.packages: pyproject.toml requirements/lock.txt | $(UV)
	@echo "clip-gateway: installing into $(VENV)"
	@requirements/uv.sh $(UV) $(PY) install --quiet -c requirements/lock.txt -e ".[all,dev,bench]"
	@touch $@

# pillow-simd's wheel compiles for a minute or more: built while the environments install
SIMD_WHEELS := $(VENV)/.pillow-simd-$(PILLOW_SIMD_VERSION)$(subst -m,-,$(SIMD_CFLAGS))
$(SIMD_WHEELS)/.built: | $(UV)
	@requirements/pillow-simd.sh build $(PY) $(PILLOW_SIMD_VERSION) "$(SIMD_CFLAGS)" $(SIMD_WHEELS)
	@touch $@

$(VENV)/.installed: $(VENV)/.packages $(if $(filter 1,$(PILLOW_SIMD)),$(SIMD_WHEELS)/.built)
	@if [ "$(PILLOW_SIMD)" = 1 ]; then \
	  requirements/pillow-simd.sh install $(PY) $(PILLOW_SIMD_VERSION) $(SIMD_WHEELS); \
	else echo "note: PILLOW_SIMD=0: stock Pillow, under half of pillow-simd's images/s per core" >&2; fi
	@touch $@

# Triton's Python-backend interpreter (numpy<2) and the PyPI tritonserver; see
# clip_gateway/launcher/local.py.
triton-env: $(TRITON_ENV)/.installed
$(TRITON_ENV)/.installed: requirements/triton-env.txt requirements/triton-server.txt | $(UV)
	@echo "clip-gateway: installing Triton into $(TRITON_ENV)"
	@$(PYTHON) -m venv $(TRITON_ENV)
	@requirements/uv.sh $(UV) $(TRITON_ENV)/bin/python install --quiet -r requirements/triton-env.txt
	@requirements/uv.sh $(UV) $(TRITON_ENV)/bin/python install --quiet --no-deps \
	  -r requirements/triton-server.txt
	@touch $@

# The peer bench's Infinity (`python -m bench peers`), in a virtualenv of its own: its pins are not
# ours. torch/torchvision are the builds on this machine's disk (others are multi-GB downloads);
# infinity-emb 0.0.78 resolves with them; its image route needs aiohttp, which its extras lack.
PEER_ENV ?= .peer-env
peer-env: $(PEER_ENV)/.installed
$(PEER_ENV)/.installed:
	@$(PYTHON) -m venv $(PEER_ENV)
	@$(PEER_ENV)/bin/pip install --quiet --quiet torch==2.14.1 torchvision==0.29.1 \
	  'infinity-emb[server,torch,vision]==0.0.78' aiohttp
	@touch $@

# A few progress lines; Triton's and the gateway's logs go to a file (VERBOSE=1: the terminal).
# The export is made as soon as the gateway's environment is there, while Triton's may still be
# installing; then everything starts.
SERVE_FLAGS = $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT)) \
  $(if $(CLIP_MODEL),--model "$(CLIP_MODEL)") $(if $(CLIP_WEIGHTS),--weights "$(CLIP_WEIGHTS)") \
  $(if $(CLIP_TOKENIZER),--tokenizer "$(CLIP_TOKENIZER)") $(if $(PROFILE),--profile $(PROFILE)) \
  $(if $(VERBOSE),--verbose)
serve:
	@$(MAKE) -s --no-print-directory -j3 $(TRITON_ENV)/.installed serve-export
	@$(VENV)/bin/clip-gateway serve $(SERVE_FLAGS)

serve-export: $(VENV)/.installed
	@$(VENV)/bin/clip-gateway serve $(SERVE_FLAGS) --export-only

test: install check pytest

check: lint typecheck

# lint-imports: the layer stack and the other import contracts in pyproject.toml
# ([tool.importlinter]; docs/ARCHITECTURE.md "Layers").
lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck:
	$(VENV)/bin/mypy

pytest:
	$(PY) -m pytest $(PYTEST_ARGS)

# The edit-test loop (docs/DEVELOPMENT.md "The fast tier"): tests/unit and tests/api without
# torch, open_clip or a tritonserver, on one pytest-xdist worker per core; `make test` stays the
# whole suite. --fast makes torch and open_clip unimportable even where they are installed.
# Bytecode is kept between runs in build/pycache even where the environment says not to write it
# (PYTHONDONTWRITEBYTECODE=1 on the 2-core machine): else every run, each worker and each child
# process compiled every module it imported again, pytest's assertion rewriting included.
FAST_WORKERS ?= auto
test-fast: $(VENV)/.installed
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache \
	  $(PY) -m pytest tests/unit tests/api --fast -m "not torch and not slow" -n $(FAST_WORKERS) $(PYTEST_ARGS)

# Mutation testing of the request path's pure modules against their unit tests ([tool.mutmut] in
# pyproject.toml). Not part of `make test`: a full run takes minutes. mutmut keeps old verdicts
# for unchanged code even when tests change, so every run starts from a fresh mutants/ copy.
MUTMUT_CHILDREN ?= 2
mutation:
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children $(MUTMUT_CHILDREN)
	$(VENV)/bin/mutmut results
	$(PY) tests/mutation_summary.py

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Re-resolve the pinned versions (needs uv: `pip install uv`).
lock: | $(UV)
	$(UV) pip compile pyproject.toml --extra all --extra dev --extra bench --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --quiet -o requirements/lock.txt

clean:
	rm -rf $(VENV) $(TRITON_ENV) $(PEER_ENV) build mutants .mypy_cache .ruff_cache .pytest_cache

# The container image (docs/CONTAINER.md), built and run with podman from Debian's packages on
# Debian stand-in bases (debootstrap; no container registry): `make image` builds the repository's
# Dockerfile as clip-gateway:local (layers cached: a second build takes seconds), `make image-test`
# runs it as users do and checks it (tests/image/). Needs root, podman, buildah, runc, debootstrap
# (.ci/run installs them). TORCH_INDEX_URL: the export stage's torch wheels (the Dockerfile's
# default; where it does not answer, the local index of this machine's pip configuration that
# serves torch: deploy/image/build.sh). IMAGE_WEIGHTS: random here (no model hub).
IMAGE ?= clip-gateway:local
IMAGE_WEIGHTS ?= random
TORCH_INDEX_URL ?=
image:
	@IMAGE_TAG=$(IMAGE) CLIP_MODEL=$(CLIP_MODEL) CLIP_WEIGHTS=$(IMAGE_WEIGHTS) \
	  TORCH_INDEX_URL=$(TORCH_INDEX_URL) deploy/image/build.sh

# In file order, so without PYTEST_ADDOPTS (a replayed seed of the suite's: docs/DEVELOPMENT.md).
image-test: $(VENV)/.installed
	PYTEST_ADDOPTS= CLIP_GATEWAY_IMAGE_TEST=1 CLIP_GATEWAY_IMAGE=$(IMAGE) $(PY) -m pytest tests/image/test_image.py \
	  -p no:randomly $(PYTEST_ARGS)
	$(PY) -m bench image-budget --image $(IMAGE) --out build/image/budget

# deploy/compose under podman-compose on the local images: a rolling restart of one gateway
# under steady load through nginx (bench/studies/rolling_restart.py; figures to bench/results/compose/).
compose-test: $(VENV)/.installed
	$(PY) -m bench rolling-restart --image $(IMAGE)

# deploy/k8s rendered without the GPU request (deploy/image/k8s) under `podman kube play`: how far
# a local pod runtime goes (tests/image/test_kube_play.py says where podman 4.3 stops).
kube-test: $(VENV)/.installed
	PYTEST_ADDOPTS= CLIP_GATEWAY_IMAGE_TEST=1 $(PY) -m pytest tests/image/test_kube_play.py -p no:randomly \
	  $(PYTEST_ARGS)

# The GPU host kit (docs/GPU_HOST.md): what a lent GPU machine lacks for `python -m bench host`,
# packed into call-sized parts under .gpukit/ (PyPI only; nothing exported here).
gpu-kit: $(VENV)/.installed
	bench/gpu_kit/prepare.sh

# An API key for deploy/compose (its `api_keys` secret), made once: a 0700 directory, the file
# 0644 inside it (compose bind-mounts it; the image's user must read it). Prints nothing secret.
KEYS_FILE := deploy/compose/secrets/api-keys
api-key:
	@if [ -s $(KEYS_FILE) ]; then echo "$(KEYS_FILE) exists; add a line to add a key"; else \
	  install -d -m 700 $(dir $(KEYS_FILE)) && \
	  (umask 022; $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(32))' > $(KEYS_FILE)) && \
	  echo "wrote a new key to $(KEYS_FILE): send it as 'Authorization: Bearer <key>'"; fi
