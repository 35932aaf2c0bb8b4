#!/usr/bin/env bash
# One device-tool call on the H200: the persistent TMA matmul kernels and the fused rotary concat
# (benchmarks/history.md, "Persistent TMA matmuls and the rotary concat"). Built here first, into
# ART: `python benchmarks/gpu/matmul_configs.py -o ART` (the 8192^3 configs, the library's
# persistent one first), `plex build benchmarks/gpu/block_attention/app.toml -o
# ART/block_attention.mln`, the same build from the commit before as
# ART/block_attention_main.mln (the A/B), and `plex tune benchmarks/gpu/block/app.toml --device
# hopper -o DIR --bundle ART/B2 --trials 6` (the block's matmul shapes, each config alone).
# Run from the tree's root:
#   ART=... WHL=... bash benchmarks/probes/gpu/persist_device.sh
# Writes $OUT/results.tgz (every log and JSON, nvidia-smi clocks and power every 250 ms).
set -u
OUT=${OUT:-/tmp/out}
ART=${ART:-benchmarks/gpu/artifacts}
mkdir -p "$OUT/r"
R="$OUT/r"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-.whl}/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$R/gpu.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
  --format=csv -lms 250 > "$R/smi.csv" 2>&1 &
SMI=$!
STAGES=${STAGES:-"tests block matmul shapes"}
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
stamp() { echo "$(date +%T) $1" >> "$R/stages.txt"; }

# 1. the kernels against fp32 (every 8192^3 config at M = 1000: a partial last row block)
if has tests; then
  stamp tests
  PLEX_GPU_ARTIFACTS="$ART" timeout 100 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_cuda_matmul_configs.py -k matmul_configs > "$R/gputest.log" 2>&1
  echo "tests rc=$?" >> "$R/stages.txt"
fi

# 2. the block, PLeX vs torch eager: this build, then the one before (persistent + fused concat
#    vs the non-persistent kernels and IREE's concat copies), each with torch interleaved
if has block; then
  for mln in block_attention block_attention_main block_attention; do
    stamp "block $mln"
    timeout 100 python3 benchmarks/probes/gpu/block_h200.py --mln "$ART/$mln.mln" --allocator caching \
      --rounds 7 --json "$R/$mln.$(date +%s).json" >> "$R/block_$mln.log" 2>&1
    echo "block $mln rc=$?" >> "$R/stages.txt"
  done
fi

# 3. matmul 8192^3: every config build and torch interleaved (25 rounds), CUPTI kernel times
if has matmul; then
  stamp matmul
  timeout 170 python3 benchmarks/probes/gpu/kernels_h200.py --configs "$ART/mm_configs.json" \
    --allocator caching --spin-us 200 --rounds ${MATMUL_ROUNDS:-25} --json "$R/matmul.json" > "$R/matmul.log" 2>&1
  echo "matmul rc=$?" >> "$R/stages.txt"
fi

# 4. the block's matmul shapes, each config alone (wall and CUPTI kernel time vs cuBLAS)
if has shapes; then
  stamp shapes
  timeout 150 python3 benchmarks/probes/gpu/tunekern_h200.py "$ART/B2" -o "$R/shapes.json" \
    --rounds 5 > "$R/shapes.log" 2>&1
  echo "shapes rc=$?" >> "$R/stages.txt"
fi
stamp done
kill "$SMI" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$OUT" r
cp "$R/stages.txt" "$R/gputest.log" "$R/matmul.log" "$OUT/" 2>/dev/null
exit 0
