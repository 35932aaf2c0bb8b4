#!/usr/bin/env bash
# The GPU tests (tests/gpu) and the placement example, in one call of the device tool, from the repository root:
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
# Exit status: 0 when every step passed. Speed is the GPU suite's (benchmarks/gpu/run_suite.sh).
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
echo "status $status; results in $OUT"
exit "$status"
