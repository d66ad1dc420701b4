#!/usr/bin/env bash
# Every GPU measurement in one command (scripts/gpu_check.py says what and how).
# Usage: scripts/gpu_check.sh [--out RESULTS.jsonl] [--dry-run] [--only env,train,decode,multi30k] [--sweep configs/sweeps/multi30k_gpu.yaml]
# Python: $PYTHON, default python3 (on a GPU machine, the one whose torch sees CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
