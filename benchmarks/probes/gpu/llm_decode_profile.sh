#!/usr/bin/env bash
# One device call: carry [".whl", "benchmarks/gpu/artifacts/llm"]; prints and writes $OUT/profile.json.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
SITE=/tmp/plex-gpu-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || { echo "wheel install failed"; exit 2; }
export PYTHONPATH="$SITE:$PWD/src:$PWD" PYTHONUNBUFFERED=1
python3 benchmarks/probes/gpu/llm_decode_profile.py 2>&1 | tee "$OUT/profile.log"
