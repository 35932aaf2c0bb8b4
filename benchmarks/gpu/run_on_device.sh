#!/usr/bin/env bash
# Everything the GPU machine runs, in one call of the device tool, from the repository root:
#
#   here:   python benchmarks/gpu/prepare.py          (builds benchmarks/gpu/artifacts/*.mln)
#   device: run(command="bash benchmarks/gpu/run_on_device.sh",
#               carry=[".whl", "benchmarks/gpu/artifacts"], timeout_s=600)
#
# The GPU machine has python3.12 with torch (CUDA) and numpy, but none of PLeX's build
# dependencies: the runtime side needs only the cp312 iree-base-runtime wheel (installed here
# with pip --target), numpy and src/ on PYTHONPATH. Results go to $OUT (at most 8 files):
#   device.txt        nvidia-smi, driver and package versions
#   gpu_tests.log     pytest tests/gpu (MLP, examples/llama small, decoder vs torch, placement)
#   placement.log     examples/placement/run.py on the hybrid CPU+CUDA variant
#   decoder_h200.md   the benchmark table (PLeX vs torch eager, prefill 8x512 and decode 8x1)
#   decoder_h200.log  its full output
#   ncu_dispatches.txt  per-kernel GPU time of one PLeX prefill + decode (Nsight Compute)
# Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
ARTIFACTS="$PWD/benchmarks/gpu/artifacts"
SITE=/tmp/plex-gpu-site

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || { echo "wheel install failed"; exit 2; }
export PYTHONPATH="$SITE:$PWD/src:$PWD" PYTHONUNBUFFERED=1 PLEX_GPU_ARTIFACTS="$ARTIFACTS"
export PATH="$SITE/iree/_runtime_libs:$PATH"

{
  date -u
  nvidia-smi
  python3 -c "import sys, numpy, torch; print(sys.version); print('numpy', numpy.__version__, \
'torch', torch.__version__, torch.cuda.get_device_name(0))"
  python3 -c "import iree.runtime as rt; print('iree drivers', rt.query_available_drivers()); \
print(rt.get_driver('cuda').query_available_devices())"
  cat "$ARTIFACTS/artifacts.json"
} >"$OUT/device.txt" 2>&1

status=0
step() {  # step NAME TIMEOUT_S LOG COMMAND...: run with a time limit, log, remember failures
  local name=$1 limit=$2 log=$3
  shift 3
  echo "== $name" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc" | tee -a "$log"
  [ "$rc" -eq 0 ] || status=1
}

step "gpu tests" 200 "$OUT/gpu_tests.log" \
  python3 -m pytest -q -rs -p no:cacheprovider tests/gpu
step "placement example" 60 "$OUT/placement.log" \
  python3 examples/placement/run.py "$ARTIFACTS/placement.mln"
step "decoder benchmark" 170 "$OUT/decoder_h200.log" \
  python3 benchmarks/probes/gpu/decoder_h200.py --mln "$ARTIFACTS/decoder.mln" --out "$OUT/decoder_h200.md"
if command -v ncu >/dev/null; then
  # Kernel names are IREE's dispatch names (e.g. prefill_dispatch_12_matmul_4096x1536x512_f16).
  step "hottest dispatches (ncu)" 90 "$OUT/ncu_dispatches.txt" \
    ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    python3 benchmarks/probes/gpu/decoder_h200.py --mln "$ARTIFACTS/decoder.mln" --once
else
  echo "ncu not on PATH: no per-dispatch profile" >"$OUT/ncu_dispatches.txt"
fi
echo "status $status; results in $OUT"
exit "$status"
