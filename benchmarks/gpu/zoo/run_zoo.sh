#!/usr/bin/env bash
# The GPU zoo in one device call, from the repository root (benchmarks/gpu/zoo/README.md):
#
#   here:   python benchmarks/gpu/zoo/build.py      (skeletons in benchmarks/gpu/artifacts/zoo)
#           pip download --no-deps timm==1.0.31 -d .whl
#   device: run(command="bash benchmarks/gpu/zoo/run_zoo.sh",
#               carry=[".whl", "benchmarks/gpu/artifacts/zoo"], timeout_s=600)
#
# Installs the cp312 runtime wheel and timm (no dependencies: the machine's torch and
# transformers stay) with pip --target, then runs run_zoo.py. Results in $OUT: device.txt,
# zoo.json (every number), zoo.log (its output and the table).
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
SITE=/tmp/plex-gpu-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || { echo "wheel install failed"; exit 2; }
export PYTHONPATH="$SITE:$PWD/src:$PWD" PYTHONUNBUFFERED=1
export PATH="$SITE/iree/_runtime_libs:$PATH"
{
  date -u
  nvidia-smi
  python3 -c "import sys, numpy, torch, transformers; print(sys.version); print('numpy', \
numpy.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name(0))"
} >"$OUT/device.txt" 2>&1
python3 benchmarks/gpu/zoo/run_zoo.py --artifacts benchmarks/gpu/artifacts/zoo \
  --json "$OUT/zoo.json" "$@" 2>&1 | tee "$OUT/zoo.log"
exit "${PIPESTATUS[0]}"
