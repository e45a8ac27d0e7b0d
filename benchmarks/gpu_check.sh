#!/usr/bin/env bash
# The pipeline on a GPU, in a few minutes: one worker with minilm:1 on cuda; for batches of
# 1, 32 and 128, throughput and the device-busy share, with and without the pipeline.
#   bash benchmarks/gpu_check.sh [extra args for tools/gpu_check.py]   (needs the [embed] extra)
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -m tandem.tools.gpu_check --device cuda --sizes 1,32,128 --json benchmarks/gpu_check.json "$@"
