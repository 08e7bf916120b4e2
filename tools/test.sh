#!/usr/bin/env bash
# Set up (tools/setup.sh) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKFMT_EXTRAS=dev,ray bash tools/setup.sh  # the demo skips Ray (600 MB); the tests use a real local Ray
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -n 2 --dist loadgroup -q -p no:cacheprovider "$@"
