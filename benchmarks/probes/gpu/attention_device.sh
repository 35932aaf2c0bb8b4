#!/usr/bin/env bash
# One device-tool call on the H200 for the attention kernels (benchmarks/history.md, "Split-KV
# decode attention ..."): the Llama-7B-shaped block with `kernels = "triton-attention"` vs torch
# eager (block_h200.py, caching allocator), then kernel-level checks with the machine's own
# Triton (attention_configs_h200.py: bf16 decode numerics, matmul configs at the prefill shapes).
# Run from the tree's root with ARTIFACTS holding block_attention.mln (built here):
#   ARTIFACTS=benchmarks/gpu/artifacts WHL=../.whl bash benchmarks/probes/gpu/attention_device.sh
set -u
OUT=${OUT:-/tmp/out}
ARTIFACTS=${ARTIFACTS:-benchmarks/gpu/artifacts}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHL:-../.whl}/*.whl
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
uptime >> "$OUT/gpu.txt"
python3 -c "import triton; print('triton', triton.__version__)" >> "$OUT/gpu.txt" 2>&1
for mln in ${MLNS:-block_attention}; do
  timeout ${BLOCK_TIMEOUT:-240} python3 benchmarks/probes/gpu/block_h200.py --mln "$ARTIFACTS/$mln.mln" \
    --allocator caching --rounds ${ROUNDS:-5} --json "$OUT/${mln}_h200.json" > "$OUT/${mln}_h200.log" 2>&1
  echo "$mln rc=$?" >> "$OUT/gpu.txt"
done
if [ -z "${SKIP_CONFIGS:-}" ]; then
  timeout ${CONFIG_TIMEOUT:-150} python3 benchmarks/probes/gpu/attention_configs_h200.py \
    --json "$OUT/attention_configs_h200.json" > "$OUT/attention_configs_h200.log" 2>&1
  echo "configs rc=$?" >> "$OUT/gpu.txt"
fi
uptime >> "$OUT/gpu.txt"
tail -n 40 "$OUT"/*.log
