#!/usr/bin/env bash
# One GPU session's measurements, in one command (a lent GPU's time is short): the environment, the packed-vs-alone
# equivalence on the GPU (bench_gpu_equivalence.py), then training throughput, step time, data wait and peak memory
# of each batch layout and attention path (bench_gpu_train.py), then a VLM step over ffd and balanced indexes across
# simulated ranks (bench_gpu_vlm.py, run on its own for the README's table). Results under $OUT (default /tmp/gpu_out):
#     OUT=/tmp/gpu_out bash benchmarks/run_gpu_session.sh
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT/nvidia_smi.txt"
$PY -c "import torch, transformers, numba, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__,
'numba', numba.__version__, 'numpy', numpy.__version__)" 2>&1 | tee "$OUT/versions.txt"
timeout "${EQ_TIMEOUT:-170}" $PY benchmarks/bench_gpu_equivalence.py --out "$OUT/bench_gpu_equivalence.json" 2>&1 \
    | grep -v -i "warn" | tee "$OUT/equivalence.log"
timeout "${TRAIN_TIMEOUT:-330}" $PY benchmarks/bench_gpu_train.py --steps "${STEPS:-25}" --warmup 5 --hidden 2048 \
    --layers 12 --heads 16 --out "$OUT/bench_gpu_train.json" ${ONLY:+--only "$ONLY"} 2>&1 \
    | grep -v '^{"step"' | tee "$OUT/train.log"
timeout "${VLM_TIMEOUT:-270}" $PY benchmarks/bench_gpu_vlm.py --out "$OUT/bench_gpu_vlm.json" 2>&1 \
    | grep -v -i "warn" | tee "$OUT/vlm.log"
