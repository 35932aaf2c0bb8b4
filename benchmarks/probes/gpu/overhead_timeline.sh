#!/usr/bin/env bash
# One device-tool call on the H200: the CUDA call overhead on the timeline (overhead_timeline.py),
# one condition per fresh process, MyeLiN before/after side by side, then the 8192^3 matmul vs
# torch (kernels_h200.py) and tests/gpu. Run from a tree holding (built on the build machine):
#   ART/block_attention.mln         plex build benchmarks/gpu/block_attention/app.toml
#   ART/block_direct.vmfb           its module by iree-compile from the executable-targets phase
#                                   (plex build --compile-to executable-targets) with
#                                   --iree-hal-indirect-command-buffers=false, a flag PLeX's
#                                   in-process compiler does not register
#   ART/block_default.vmfb          the same without that flag (the control)
#   ART/kernels.mln                 plex build benchmarks/gpu/kernels/app.toml
#   BEFORE/myelin                   the runtime before this change (its src/ folder)
# and PLEX_GPU_ARTIFACTS holding the tests' .mln files. Everything lands in $OUT/results.tgz.
set -u
OUT=${OUT:-/tmp/out}
ART=${ART:-art}
BEFORE=${BEFORE:-before/src}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-../.whl}/*.whl
AFTER_PATH=/tmp/site:$PWD/src
BEFORE_PATH=/tmp/site:$PWD/$BEFORE
T=benchmarks/probes/gpu/overhead_timeline.py
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
nproc >> "$OUT/gpu.txt"
uptime >> "$OUT/gpu.txt"

run() {  # run LABEL PYTHONPATH ARGS...: one fresh process, one JSON line per entrypoint
  local label=$1 path=$2
  shift 2
  PYTHONPATH=$path timeout 60 python3 $T --label "$label" "$@" >> "$OUT/timeline.jsonl" 2>> "$OUT/timeline.err" \
    || echo "{\"label\": \"$label\", \"failed\": true}" >> "$OUT/timeline.jsonl"
}

B="--mln $ART/block_attention.mln --block --fns decode,prefill"
K="--mln $ART/kernels.mln --fns decode_bt,matmul,identity"
round() {
  run "block raw caching" "$AFTER_PATH" $B --path raw --allocator caching
  run "block myelin-after caching" "$AFTER_PATH" $B --path myelin --allocator caching
  run "block myelin-before caching" "$BEFORE_PATH" $B --path myelin --allocator caching
  run "kernels raw caching" "$AFTER_PATH" $K --path raw --allocator caching
  run "kernels myelin-after caching" "$AFTER_PATH" $K --path myelin --allocator caching
  run "kernels myelin-before caching" "$BEFORE_PATH" $K --path myelin --allocator caching
}
round
# The GPU tests on the runtime after this change
PLEX_GPU_ARTIFACTS=${GPU_ARTIFACTS:-$PWD/gpuart} PYTHONPATH=$AFTER_PATH timeout 90 \
  python3 -m pytest -q -rs -p no:cacheprovider tests/gpu > "$OUT/gpu_tests.log" 2>&1
# The 8192^3 matmul vs torch eager, the runtime after this change
PYTHONPATH=$AFTER_PATH timeout 120 python3 benchmarks/probes/gpu/kernels_h200.py --mln "$ART/kernels.mln" --short \
  --allocator=caching --json "$OUT/kernels_caching.json" > "$OUT/kernels_caching.log" 2>&1
run "direct block raw caching graphs" "$AFTER_PATH" $B --path raw --allocator caching \
  --vmfb "$ART/block_direct.vmfb" --flags=--cuda_use_streams=false
run "direct block raw caching streams" "$AFTER_PATH" $B --path raw --allocator caching \
  --vmfb "$ART/block_direct.vmfb"
run "kernels raw caching poll" "$AFTER_PATH" $K --path raw --allocator caching --wait poll
run "block raw pool" "$AFTER_PATH" $B --path raw --allocator pool
run "kernels raw pool" "$AFTER_PATH" $K --path raw --allocator pool
run "iree-compile block raw caching" "$AFTER_PATH" $B --path raw --allocator caching \
  --vmfb "$ART/block_default.vmfb"
round  # the spread between fresh processes
run "block myelin-after pool" "$AFTER_PATH" $B --path myelin --allocator pool
run "block raw caching graphs" "$AFTER_PATH" $B --path raw --allocator caching --flags=--cuda_use_streams=false
uptime >> "$OUT/gpu.txt"
tar -C "$OUT" -czf /tmp/results.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
