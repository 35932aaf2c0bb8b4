# Sourced by the GPU machine's scripts (run_suite.sh, llm/run_llm.sh, the GPU probes), from the
# repository root: installs the carried wheels (.whl/) with pip --target, without dependencies,
# so the machine's torch and transformers stay, and puts them and the tree on the import path.
# Sets OUT (the device tool's output folder, or ./gpu-results) and SITE.
OUT="${OUT:-$PWD/gpu-results}"
mkdir -p "$OUT"
SITE=/tmp/plex-gpu-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || { echo "wheel install failed"; exit 2; }
export PYTHONPATH="$SITE:$PWD/src:$PWD" PYTHONUNBUFFERED=1
export PATH="$SITE/iree/_runtime_libs:$PATH"
