# Two commands matter: `make serve` and `make test`. Everything else is what they are built from.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TRITON_ENV ?= .triton-env
PY := $(VENV)/bin/python
PORT ?= 8000
# Weights for `make serve`: an open_clip pretrained tag, a checkpoint path, or `random`.
CLIP_WEIGHTS ?= laion2b_s34b_b79k
# Triton profile: cpu | cuda | tensorrt (GPU profiles need an NGC tritonserver; see deploy/).
PROFILE ?= cpu

.PHONY: install triton-env serve test check lint format typecheck pytest lock clean

install: $(VENV)/.installed $(TRITON_ENV)/.installed

$(VENV)/.installed: pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c requirements/lock.txt -e ".[export,dev]"
	touch $@

# Triton's Python-backend interpreter (numpy<2) and the PyPI tritonserver; see gateway/localtriton.py.
triton-env: $(TRITON_ENV)/.installed
$(TRITON_ENV)/.installed: requirements/triton-env.txt requirements/triton-server.txt
	$(PYTHON) -m venv $(TRITON_ENV)
	$(TRITON_ENV)/bin/pip install --quiet -r requirements/triton-env.txt
	$(TRITON_ENV)/bin/pip install --quiet --no-deps -r requirements/triton-server.txt
	touch $@

serve: install
	$(PY) -m gateway.serve --port $(PORT) --weights "$(CLIP_WEIGHTS)" --profile $(PROFILE)

test: install check pytest

check: lint typecheck

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:
	$(VENV)/bin/mypy

pytest:
	$(PY) -m pytest $(PYTEST_ARGS)

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Re-resolve the pinned versions (needs uv: `pip install uv`).
lock:
	uv pip compile pyproject.toml --extra export --extra dev --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --quiet -o requirements/lock.txt

clean:
	rm -rf $(VENV) $(TRITON_ENV) build .mypy_cache .ruff_cache .pytest_cache
