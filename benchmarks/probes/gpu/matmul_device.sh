#!/usr/bin/env bash
# One device-tool call on the H200: matmul 8192^3 kernel configs and the "device" call path vs
# torch, the tuned GEMVs, the per-call overhead on the timeline (raw IREE, MyeLiN before and
# after a runtime change, the hybrid wait), the block, and the GPU kernel checks.
# Built here first (benchmarks/gpu/README.md): into ART, `matmul_configs.py -o ART`, kernels.mln,
# tunekern.mln, tunekern_tuned.mln, block_attention.mln; the runtime before the change in
# BEFORE (a copy of src/; optional). Run from the tree's root:
#   ART=... WHL=... [BEFORE=before/src] bash benchmarks/probes/gpu/matmul_device.sh
# Writes $OUT/results.tgz (every log and JSON) and the main logs beside it.
set -u
OUT=${OUT:-/tmp/out}
ART=${ART:-benchmarks/gpu/artifacts}
mkdir -p "$OUT/r"
R="$OUT/r"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-../.whl}/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$R/gpu.txt" 2>&1
uptime >> "$R/gpu.txt"
STAGES=${STAGES:-"matmul timeline block tests"}
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# 1. matmul 8192^3 on every config build and torch, interleaved; the GEMVs tuned and untuned
if has matmul; then
  timeout 200 python3 benchmarks/probes/gpu/kernels_h200.py --configs "$ART/mm_configs.json" \
    --gemv-tuned "$ART/tunekern_tuned.mln" --gemv "$ART/tunekern.mln" --allocator caching \
    --spin-us 200 --rounds 15 --json "$R/matmul_gemv.json" > "$R/matmul_gemv.log" 2>&1
  echo "matmul rc=$?" >> "$R/gpu.txt"
fi

# 2. one fresh process per condition: raw iree.runtime (blocking, polling), MyeLiN after
#    (blocking, hybrid wait), MyeLiN before
if has timeline; then
  T=benchmarks/probes/gpu/overhead_timeline.py
  K="--mln $ART/kernels.mln --fns matmul,decode_bt,identity --allocator caching"
  {
    for round in ${TIMELINE_ROUNDS:-1 2}; do
      timeout 40 python3 $T $K --path raw --label "raw r$round"
      timeout 40 python3 $T $K --path raw --wait poll --label "raw poll r$round"
      timeout 40 python3 $T $K --path myelin --label "after r$round"
      timeout 40 python3 $T $K --path myelin --spin-us 200 --label "after spin200 r$round"
      if [ -n "${BEFORE:-}" ]; then
        PYTHONPATH=/tmp/site:$PWD/$BEFORE timeout 40 python3 $T $K --path myelin --label "before r$round"
      fi
    done
  } > "$R/timeline.jsonl" 2> "$R/timeline.err"
fi

# 3. the Llama-7B-shaped block, PLeX vs torch eager
if has block; then
  timeout 120 python3 benchmarks/probes/gpu/block_h200.py --mln "$ART/block_attention.mln" \
    --allocator caching --rounds 5 --json "$R/block.json" > "$R/block.log" 2>&1
fi

# 4. the kernel checks against fp32
if has tests; then
  PLEX_GPU_ARTIFACTS="$ART" timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_cuda_matmul_configs.py > "$R/gputest.log" 2>&1
fi
uptime >> "$R/gpu.txt"
tar czf "$OUT/results.tgz" -C "$OUT" r
cp "$R/matmul_gemv.log" "$R/gputest.log" "$R/gpu.txt" "$OUT/" 2>/dev/null
exit 0
