#!/usr/bin/env bash
# The stages on a GPU, in a few minutes: minilm:1 and cnn:1 on cuda at max batches of 1, 32
# and 128, one worker at saturation with staging on and off: throughput, each stage's time,
# the device's busy share and idle gap; the copy bandwidth from a reused pinned slot, from
# memory pinned per batch and from pageable memory; staged outputs against the serial path's.
#   bash benchmarks/gpu_check.sh [extra args for tools/gpu_check.py]   (needs the [embed] extra)
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -m tandem.tools.gpu_check --device cuda --sizes 1,32,128 --json benchmarks/gpu_check.json "$@"
