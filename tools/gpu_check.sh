#!/usr/bin/env bash
# The prepared check for a lent GPU (docs/scale.md, "A prepared GPU check"): agentcap's own GRPO step
# (GRPOModule.update through agentcap.training.harness), sharded with FSDP2 and bf16-mixed, of a 1.24 B model
# (generate and update throughput, MFU), the judges' prefix reader, and vLLM's
# GPU path if vLLM is there. Runs from a copy of the repository root in a few minutes and prints one
# table; figures and the log go to $OUT (default runs/gpu_check). Touches no GPU setting.
#   bash tools/gpu_check.sh                         # on the GPU machine
#   PYTHON=.venv/bin/python bash tools/gpu_check.sh --smoke    # every part at tiny size, on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"

# agentcap itself, without its pins (the machine's torch / transformers / lightning stay); its other
# imports on this path (peft, torchmetrics) are on the GPU image. No network there: no build isolation.
if ! (cd /tmp && "$PY" -c "import agentcap" 2>/dev/null); then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
    || { echo "gpu_check: pip install -e . failed; using PYTHONPATH=$PWD" >&2; export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"; }
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
PYTHONUNBUFFERED=1 "$PY" tools/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
