#!/usr/bin/env bash
# The GPU suite in one call of the device tool, from the repository root (docs/benchmarks.md):
#
#   here:   the wheels in .whl/ (the cp312 iree-base-runtime wheel; timm, for the zoo's timm
#           models: pip download --no-deps timm==1.0.31 -d .whl)
#           python -m benchmarks prepare gpu      (builds benchmarks/gpu/suite/, weights stripped)
#   device: run(command="bash benchmarks/gpu/run_suite.sh",
#               carry=[".whl", "benchmarks/gpu/suite"], timeout_s=600)
#
# The GPU machine has python3.12 with torch (CUDA), transformers and numpy, and no IREE
# compiler; the wheels are installed with pip --target, without dependencies (its torch and
# transformers stay). The result file is written again after every case, and no case starts
# after DEADLINE seconds (default 420): the rest are recorded as skipped, so the file is complete
# inside the device call's 10 minutes (and holds every finished case if the run is cut short).
# Writes to $OUT: device.txt (nvidia-smi, versions), suite.log (the run) and gpu/<date>_<gpu>.json
# (the result file: copy it into benchmarks/results/gpu/ here, then `python -m benchmarks report
# --write docs/benchmarks.md`).
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/runtime_env.sh
# the commit the cases were built at (this copy's .git, if any, is stale)
PLEX_REVISION="built at $(cat benchmarks/gpu/suite/revision 2>/dev/null || echo unknown)"
export PLEX_REVISION

{
  date -u
  nvidia-smi
  python3 -c "import sys, numpy, torch, transformers; print(sys.version); print('numpy', \
numpy.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name(0))"
} >"$OUT/device.txt" 2>&1

timeout 570 python3 -m benchmarks gpu --prebuilt benchmarks/gpu/suite --results "$OUT" \
  --deadline "${DEADLINE:-420}" 2>&1 | tee "$OUT/suite.log"
exit "${PIPESTATUS[0]}"
