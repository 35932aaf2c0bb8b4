#!/usr/bin/env bash
# The GPU LLM benchmark in one device call, from the repository root (benchmarks/gpu/llm/README.md):
#
#   here:   python benchmarks/gpu/llm/build.py --families llama qwen2
#           (skeletons in benchmarks/gpu/artifacts/llm; the cp312 runtime wheel in .whl/)
#   device: run(command="bash benchmarks/gpu/llm/run_llm.sh",
#               carry=[".whl", "benchmarks/gpu/artifacts/llm"], timeout_s=600)
#
# Installs the runtime wheel with pip --target (the machine's torch and transformers stay), then
# runs run_llm.py with the arguments given. Results in $OUT: device.txt, llm.json (a
# benchmarks/results.py run), llm-raw.json (every number and token check), llm.md (the table),
# llm.log (the output).
set -uo pipefail
cd "$(dirname "$0")/../../.."
source benchmarks/gpu/runtime_env.sh
{
  date -u
  nvidia-smi
  python3 -c "import sys, numpy, torch, transformers; print(sys.version); print('numpy', \
numpy.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name(0))"
} >"$OUT/device.txt" 2>&1
python3 benchmarks/gpu/llm/run_llm.py --artifacts benchmarks/gpu/artifacts/llm --out "$OUT" "$@" \
  2>&1 | tee "$OUT/llm.log"
exit "${PIPESTATUS[0]}"
