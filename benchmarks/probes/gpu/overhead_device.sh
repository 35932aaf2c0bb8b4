#!/usr/bin/env bash
# One device-tool call on the H200: where a CUDA call's time goes, and the Llama-7B-shaped block.
# Run from the tree's root with ARTIFACTS holding kernels.mln and block.mln (built here):
#   ARTIFACTS=benchmarks/gpu/artifacts bash benchmarks/probes/gpu/overhead_device.sh
# Writes to $OUT: overhead*.json/log (overhead_h200.py, default flags and variants), iree-*.log
# (IREE's own C tools on the same module: no Python in the loop), kernels_h200_*, gemv_h200_*,
# block_h200_*.json/log (numbered in the order of the allocation modes), gputest.log.
set -u
OUT=${OUT:-/tmp/out}
ARTIFACTS=${ARTIFACTS:-benchmarks/gpu/artifacts}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-../.whl}/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
TOOLS=/tmp/site/iree/_runtime_libs
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
uptime >> "$OUT/gpu.txt"

STAGES=${STAGES:-"python ctools matrix block"}
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# 1. Python: MyeLiN vs raw iree.runtime, pieces, traces
if has python; then
python3 benchmarks/probes/gpu/overhead_h200.py --mln "$ARTIFACTS/kernels.mln" --out "$OUT/overhead" \
  --block "$ARTIFACTS/block.mln" > "$OUT/overhead.log" 2>&1
python3 benchmarks/probes/gpu/overhead_h200.py --mln "$ARTIFACTS/kernels.mln" --out "$OUT/overhead_notracing" \
  --n 150 --flags=--cuda_tracing=0 > "$OUT/overhead_notracing.log" 2>&1
fi

# 1b. One condition per fresh process: torch or not, imported or IREE buffers, CUPTI first or not
if has matrix; then
  K="$ARTIFACTS/kernels.mln"; B="$ARTIFACTS/block.mln"; I=benchmarks/probes/gpu/overhead_isolate.py
  {
    for c in "raw none" "raw init" "raw inputs" "myelin none" "myelin init" "myelin inputs"; do
      set -- $c; python3 $I --mln $K --fn decode_bt --path $1 --torch $2
    done
    python3 $I --mln $K --fn decode_bt --path raw --torch inputs --profile-first
    python3 $I --mln $K --fn decode_bt --path myelin --torch inputs --profile-first
    python3 $I --mln $K --fn identity --path raw --torch none
    python3 $I --mln $K --fn decode_bt --path myelin --torch none --cprofile 2> "$OUT/cprofile_myelin.txt"
    python3 $I --mln $K --fn decode_bt --path raw --torch none --cprofile 2> "$OUT/cprofile_raw.txt"
    python3 $I --mln $K --fn identity --path myelin --torch none
    for c in "raw none" "raw inputs" "myelin none" "myelin inputs"; do
      set -- $c; python3 $I --mln $B --block --fn decode --path $1 --torch $2 --n 100
    done
    for c in "raw none" "myelin none" "myelin inputs"; do
      set -- $c; python3 $I --mln $B --block --fn prefill --path $1 --torch $2 --n 50
    done
  } > "$OUT/matrix.jsonl" 2> "$OUT/matrix.err"
fi

# 1c. The allocator: IREE's pools (default) vs its caching allocator, fresh processes
if has alloc; then
  K="$ARTIFACTS/kernels.mln"; B="$ARTIFACTS/block.mln"; I=benchmarks/probes/gpu/overhead_isolate.py
  {
    for a in pool caching; do
      for p in raw myelin; do
        python3 $I --mln $K --fn decode_bt --path $p --allocator $a
        python3 $I --mln $B --block --fn decode --path $p --allocator $a --n 100
        python3 $I --mln $B --block --fn prefill --path $p --allocator $a --n 50
      done
    done
  } > "$OUT/alloc.jsonl" 2> "$OUT/alloc.err"
fi

if has ctools; then

# 2. IREE's C tools on the same module: the runtime alone, no Python
python3 - "$ARTIFACTS/kernels.mln" "$OUT/bench.vmfb" <<'EOF'
import sys
from myelin.mln import MlnReader
r = MlnReader(sys.argv[1])
open(sys.argv[2], "wb").write(bytes(r.section_view("variant/hopper/module/bench")))
EOF
for fl in "" "--cuda_tracing=0" "--cuda_async_allocations=false" "--device_allocator=caching" "--cuda_use_streams=false" "--cuda_allow_inline_execution=true"; do
  for f in identity decode_bt; do
    if [ $f = identity ]; then ins="--input=8xf16=1"; else ins="--input=8x4096xf16=0.01 --input=4096x4096xf16=0.01"; fi
    echo "== $f flags=[$fl]" >> "$OUT/iree-benchmark.log"
    timeout 60 $TOOLS/iree-benchmark-module --device=cuda --module="$OUT/bench.vmfb" --function=$f $ins $fl \
      --benchmark_min_time=0.5s --benchmark_repetitions=3 >> "$OUT/iree-benchmark.log" 2>&1
  done
done
python3 - "$ARTIFACTS/block.mln" "$OUT/block.vmfb" <<'EOF'
import sys
from myelin.mln import MlnReader
r = MlnReader(sys.argv[1])
open(sys.argv[2], "wb").write(bytes(r.section_view("variant/hopper/module/block")))
EOF
BLOCK_IN="--input=8x4096xf16=0.01 --input=8x64xf16=0.5 --input=8x64xf16=0.5 --input=8x32x2048x128xf16=0.01 --input=8x32x2048x128xf16=0.01 --input=4096xf16=1"
for w in 4096x4096 4096x4096 4096x4096 4096x4096; do BLOCK_IN="$BLOCK_IN --input=${w}xf16=0.001"; done
BLOCK_IN="$BLOCK_IN --input=4096xf16=1 --input=11008x4096xf16=0.001 --input=11008x4096xf16=0.001 --input=4096x11008xf16=0.001"
for fl in "" "--cuda_use_streams=false"; do
  echo "== block decode flags=[$fl]" >> "$OUT/iree-benchmark.log"
  timeout 90 $TOOLS/iree-benchmark-module --device=cuda --module="$OUT/block.vmfb" --function=decode $BLOCK_IN $fl \
    --benchmark_min_time=50x --benchmark_repetitions=3 >> "$OUT/iree-benchmark.log" 2>&1
done
# HAL profile of a few calls: host queue events vs device dispatch times (the widest set of
# data families the CUDA HAL accepts)
for mode in queue-events,host-execution,device-queue-events,dispatch-events,memory-events \
            queue-events,device-queue-events,dispatch-events,memory-events \
            queue-events,dispatch-events,memory-events queue-events,dispatch-events queue-events; do
  echo "== mode $mode" >> "$OUT/iree-profile-run.log"
  if timeout 60 $TOOLS/iree-benchmark-module --device=cuda --module="$OUT/bench.vmfb" --function=decode_bt \
      --input=8x4096xf16=0.01 --input=4096x4096xf16=0.01 --benchmark_min_time=20x \
      --device_profiling_mode=$mode --device_profiling_output="$OUT/decode_bt.ireeprof" \
      >> "$OUT/iree-profile-run.log" 2>&1; then break; fi
done
for c in summary explain queue memory; do
  echo "== iree-profile $c" >> "$OUT/iree-profile.log"
  timeout 60 $TOOLS/iree-profile $c "$OUT/decode_bt.ireeprof" >> "$OUT/iree-profile.log" 2>&1
done
timeout 60 $TOOLS/iree-profile queue --format=jsonl --dispatch_events "$OUT/decode_bt.ireeprof" > "$OUT/iree-profile-queue.jsonl" 2>&1
if command -v strace >/dev/null; then
  timeout 60 strace -f -c -o "$OUT/strace_iree_benchmark.txt" $TOOLS/iree-benchmark-module --device=cuda \
    --module="$OUT/bench.vmfb" --function=decode_bt --input=8x4096xf16=0.01 --input=4096x4096xf16=0.01 \
    --benchmark_min_time=1000x > /dev/null 2>&1
else
  echo "no strace" > "$OUT/strace_iree_benchmark.txt"
fi

fi

# 2b. The 8192^3 matmul and the Llama projections again, in the chosen allocation modes
# (MATMUL_ALLOCATORS, default BLOCK_ALLOCATORS; a mode may be bounded: "caching:16G;16")
if has matmul; then
  i=0
  for a in ${MATMUL_ALLOCATORS:-${BLOCK_ALLOCATORS:-pool}}; do
    timeout 120 python3 benchmarks/probes/gpu/kernels_h200.py --mln "$ARTIFACTS/kernels.mln" --short \
      --allocator="$a" --json "$OUT/kernels_h200_$i.json" > "$OUT/kernels_h200_$i.log" 2>&1
    i=$((i + 1))
  done
fi

# 2c. Issue 17's GEMVs (both weight layouts), from tunekern.mln (benchmarks/gpu/tunekern)
if has gemv && [ -f "$ARTIFACTS/tunekern.mln" ]; then
  i=0
  for a in ${MATMUL_ALLOCATORS:-${BLOCK_ALLOCATORS:-pool}}; do
    timeout 120 python3 benchmarks/probes/gpu/kernels_h200.py --gemv "$ARTIFACTS/tunekern.mln" \
      --allocator="$a" --json "$OUT/gemv_h200_$i.json" > "$OUT/gemv_h200_$i.log" 2>&1
    i=$((i + 1))
  done
fi

# 3. The block: PLeX vs torch eager (BLOCK: which build, default block.mln)
BLOCK=${BLOCK:-$ARTIFACTS/block.mln}
if has block && [ -f "$BLOCK" ]; then
  i=0
  for a in ${BLOCK_ALLOCATORS:-pool}; do
    timeout 150 python3 benchmarks/probes/gpu/block_h200.py --mln "$BLOCK" --json "$OUT/block_h200_$i.json" \
      --allocator="$a" > "$OUT/block_h200_$i.log" 2>&1
    i=$((i + 1))
  done
fi

# 4. The DLPack-results GPU tests (dlpack.mln: storage twins with transients)
if has gputest && [ -f "$ARTIFACTS/dlpack.mln" ]; then
  timeout 120 python3 -m pytest -q tests/gpu/test_cuda_dlpack_results.py > "$OUT/gputest.log" 2>&1
fi
rm -f "$OUT/bench.vmfb" "$OUT/block.vmfb"
ls -laR "$OUT" > "$OUT/files.txt"
# The device tool brings back only a few files: everything in one archive.
tar -C "$OUT" -czf /tmp/results.tgz . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
