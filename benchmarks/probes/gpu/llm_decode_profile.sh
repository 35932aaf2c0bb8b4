#!/usr/bin/env bash
# One device call: carry [".whl", "benchmarks/gpu/artifacts/llm"]; prints and writes $OUT/profile.json.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/gpu/runtime_env.sh
python3 benchmarks/probes/gpu/llm_decode_profile.py 2>&1 | tee "$OUT/profile.log"
