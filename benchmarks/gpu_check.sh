#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): training MFU and generation throughput on one GPU, offline.
#   bash benchmarks/gpu_check.sh [--dry-run] [--output-json FILE]
# Needs only what is installed (torch, transformers >= 5.24, tokenizers; ctranslate2 optional); downloads nothing.
# Wheels in $WHEELS (default benchmarks/.wheels, git-ignored) are installed first into a temporary folder that
# shadows the machine's packages: how a machine with an older transformers runs it (see benchmarks/README.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEELS="${WHEELS:-$ROOT/benchmarks/.wheels}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the model package, installed or not
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE="$(mktemp -d)"
  "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE:$PYTHONPATH"
  echo "gpu_check.sh: installed into $SITE: $(cd "$WHEELS" && ls -- *.whl | tr '\n' ' ')" >&2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PYTHON" "$ROOT/benchmarks/gpu_check.py" "$@"
