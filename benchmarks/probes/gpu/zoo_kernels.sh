#!/usr/bin/env bash
# One device call: carry [".whl", "benchmarks/gpu/suite"]; prints one JSON object per zoo case.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/gpu/runtime_env.sh
python3 benchmarks/probes/gpu/zoo_kernels.py "$@" 2>&1 | tee "$OUT/zoo_kernels.log"
