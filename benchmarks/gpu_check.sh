#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): training MFU and generation throughput on one GPU, offline.
#   bash benchmarks/gpu_check.sh [--dry-run] [--output-json FILE]
# Needs only what is installed (torch, transformers, tokenizers; ctranslate2 optional); downloads nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the model package, installed or not
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" "$ROOT/benchmarks/gpu_check.py" "$@"
