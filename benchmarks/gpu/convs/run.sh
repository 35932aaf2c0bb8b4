#!/usr/bin/env bash
# Convolutions on CUDA in one call of the device tool, from the repository root
# (docs/kernels.md, "Convolutions"):
#
#   here:   the wheels in .whl/ (benchmarks/gpu/README.md: iree-base-runtime cp312, timm)
#           python -m benchmarks prepare gpu --config convs -o benchmarks/gpu/convs/suite
#           python benchmarks/probes/gpu/conv_codegen.py prepare
#   device: run(command="bash benchmarks/gpu/convs/run.sh",
#               carry=[".whl", "benchmarks/gpu/convs/suite", "benchmarks/gpu/convs/probe"],
#               timeout_s=600)
#
# First the single-convolution probe (benchmarks/probes/gpu/conv_codegen.py: is IREE's f16
# convolution code wrong by itself; the rewritten forms against torch), then ResNet-50 in f16 at
# batch 1 and 16: IREE's codegen for everything (before) and convolutions on the matmul kernels
# (after), each checked against torch eager and timed beside torch eager (and torch.compile for
# the kernel rows). Writes to $OUT: device.txt, conv_codegen.log/.json, suite.log and
# gpu/<date>_<gpu>.json (the suite's result file).
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/gpu/runtime_env.sh
PLEX_REVISION="built at $(cat benchmarks/gpu/convs/suite/revision 2>/dev/null || echo unknown)"
export PLEX_REVISION

{
  date -u
  nvidia-smi
  python3 -c "import sys, numpy, torch; print(sys.version); print('numpy', numpy.__version__, \
'torch', torch.__version__, torch.cuda.get_device_name(0))"
} >"$OUT/device.txt" 2>&1

timeout 120 python3 benchmarks/probes/gpu/conv_codegen.py run --out "$OUT" 2>&1 \
  | tee "$OUT/conv_codegen.log"
timeout 440 python3 -m benchmarks gpu --config convs --prebuilt benchmarks/gpu/convs/suite \
  --results "$OUT" --deadline "${DEADLINE:-330}" 2>&1 | tee "$OUT/suite.log"
exit "${PIPESTATUS[0]}"
