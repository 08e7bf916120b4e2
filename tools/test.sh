#!/usr/bin/env bash
# Set up (tools/setup.sh) and run the tests. Extra arguments go to pytest.
#   bash tools/test.sh           the fast suite: every test not marked slow (a few minutes on 2 cores)
#   bash tools/test.sh --slow    the slow tests: real Ray, the S3-protocol server, Energon, torchrun, big sweeps
#   bash tools/test.sh --all     both in one run
# Which tests are slow, and why, is one list: tests/conftest.py. CI (.ci/run) runs the fast suite, then the slow one.
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not slow")
case "${1:-}" in
  --slow) select=(-m slow); shift ;;
  --all) select=(); shift ;;
esac
PACKFMT_EXTRAS=dev,ray bash tools/setup.sh  # the demo skips Ray (600 MB); the slow tests use a real local Ray
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
start=$(date +%s.%N)
status=0
.venv/bin/python -m pytest -n 2 --dist loadgroup -q -p no:cacheprovider ${select[@]+"${select[@]}"} "$@" || status=$?
# the suite's wall time, with the load it ran under (the limits of tests/limits.py scale with it)
awk -v s="$start" -v e="$(date +%s.%N)" -v l="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)" \
    'BEGIN { printf "tools/test.sh: wall time %.1f s (load average %s)\n", e - s, l }'
exit "$status"
