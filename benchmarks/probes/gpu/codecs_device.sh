#!/usr/bin/env bash
# The H200 codec run at a realistic size, one device call (benchmarks/gpu/README.md, "Codecs at a
# realistic size"): rebuild the decoder7b .mln files' parameters from their seed (payload.py),
# check the q4 kernel against numpy (tests/gpu/test_cuda_q4_kernel.py), then time the decode
# steps of fp16, q4 and torch eager (codecs_h200.py). Builds nothing but the parameter payloads.
#
#   ART     folder with d7_fp16.skel/, d7_q4.skel/ (payload.py strip) and q4kernel.mln
#   WHEELS  folder with the cp312 iree-base-runtime wheel (default .whl)
#   OUT     where the logs and the table go
set -euo pipefail
cd "$(dirname "$0")/../../.."
ART=${ART:-benchmarks/gpu/artifacts}
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-/tmp/codecs-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
nproc >> "$OUT/device.txt"
python3 benchmarks/gpu/payload.py rebuild "$ART/d7_fp16.skel=/tmp/d7_fp16.mln" \
    "$ART/d7_q4.skel=/tmp/d7_q4.mln" --weights benchmarks/gpu/decoder7b/model.py:weights \
    2>&1 | tee "$OUT/payload.log"
PLEX_GPU_ARTIFACTS="$ART" python3 -m pytest -q -s tests/gpu/test_cuda_q4_kernel.py \
    2>&1 | tee "$OUT/gpu_tests.log" || true
python3 benchmarks/probes/gpu/codecs_h200.py --mln fp16=/tmp/d7_fp16.mln --mln q4=/tmp/d7_q4.mln \
    --entry decode --entry decode1 --decoded q4 --rounds "${ROUNDS:-5}" --calls "${CALLS:-20}" \
    --out "$OUT/codecs_h200.md" 2>&1 | tee "$OUT/codecs_h200.log"
