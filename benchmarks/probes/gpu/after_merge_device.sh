#!/usr/bin/env bash
# One device-tool call after a merge of GPU work: tests/gpu, the Llama-7B-shaped block with the
# attention kernels vs torch eager (block_h200.py, caching allocator), and the kernel-config
# cases of the tunekern bundle (matmul 8192^3, GEMV in both stored layouts) vs IREE's codegen
# and torch (tunekern_h200.py). Everything is built here first:
#   python benchmarks/gpu/prepare.py --skip decoder     # (decoder.mln alone is 31 MiB)
#   plex build benchmarks/gpu/block_attention/app.toml -o benchmarks/gpu/artifacts/block_attention.mln
#   plex tune benchmarks/gpu/tunekern/app.toml --device hopper -o DIR --bundle benchmarks/gpu/artifacts/tunekern
#   plex build benchmarks/gpu/tunekern/codegen/app.toml -o benchmarks/gpu/artifacts/codegen.mln
# then, there, from the tree's root: `bash benchmarks/probes/gpu/after_merge_device.sh` with carry
# [".whl", "benchmarks/gpu/artifacts"]. Everything lands in $OUT/results.tgz (the device tool
# brings back only a few files).
set -u
OUT=${OUT:-/tmp/out}
ART=benchmarks/gpu/artifacts
R=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
{ date -u; uptime; nvidia-smi --query-gpu=name,driver_version --format=csv; } > "$R/gpu.txt" 2>&1
timeout 200 python3 -m pytest -q tests/gpu > "$R/tests_gpu.log" 2>&1; echo "tests rc=$?" >> "$R/gpu.txt"
timeout 150 python3 benchmarks/probes/gpu/block_h200.py --mln "$ART/block_attention.mln" --allocator caching \
  --rounds 5 --json "$R/block_attention_h200.json" > "$R/block_attention_h200.log" 2>&1
echo "block rc=$?" >> "$R/gpu.txt"
timeout 150 python3 benchmarks/probes/gpu/tunekern_h200.py "$ART/tunekern" --codegen "$ART/codegen.mln" \
  --rounds 5 -o "$R/tunekern_h200.json" > "$R/tunekern_h200.log" 2>&1
echo "tunekern rc=$?" >> "$R/gpu.txt"
uptime >> "$R/gpu.txt"
tar -C "$R" -czf "$OUT/results.tgz" .
cat "$R/gpu.txt"; tail -n 5 "$R/tests_gpu.log"; tail -n 25 "$R/block_attention_h200.log" "$R/tunekern_h200.log"
