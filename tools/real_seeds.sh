#!/usr/bin/env bash
# Run a real-speech recipe (configs/real/NAME.yaml) over seeds, JOBS at once, each under
# /usr/bin/time -v (wall time, peak RSS in RUNS/NAME-demo-sSEED.time), then the tables with 95 %
# intervals over seeds (agentcap.evaluation.seeds, as tools/seeds.sh prints them).
# AudioMap's GRPO and ACE-Cap's audio roles start from one SFT warm start (configs/real/audiomap-sft.yaml,
# seed 0), run and exported first when runs/real/audiomap-sft/export/policy is missing.
#   JOBS=1 bash tools/real_seeds.sh audiomap 1 2 3
#   OMP_NUM_THREADS=1 JOBS=2 bash tools/real_seeds.sh acecap 3 4
#   PAIRS=before_sft:before_grpo,before_grpo:after_grpo SKIP_RUNS=1 bash tools/real_seeds.sh audiomap 1 2 3
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: tools/real_seeds.sh audiomap|acecap SEED...}
shift
runs=${RUNS:-runs/real}
jobs=${JOBS:-1}
mkdir -p "$runs"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}  # docs/real.md names each run's count: 1 and 2 threads give other bits
export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2} MKL_CBWR=${MKL_CBWR:-AVX2} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX2}
[ -f data/real_speech/benchmark.jsonl ] || .venv/bin/python tools/make_real_speech.py --out data/real_speech --seed 0
warm=runs/real/audiomap-sft
if [ -z "${SKIP_RUNS:-}" ] && [ ! -f "$warm/export/policy/config.json" ]; then
  /usr/bin/time -v -o "$warm.time" .venv/bin/agentcap fit --config configs/real/audiomap-sft.yaml > "$warm.log" 2>&1
  .venv/bin/agentcap export --config configs/real/audiomap-sft.yaml --out "$warm/export" >> "$warm.log" 2>&1
fi
if [ -z "${SKIP_RUNS:-}" ]; then
  for seed in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    dir="$runs/$name-demo-s$seed"
    rm -rf "$dir"
    # shellcheck disable=SC2086
    /usr/bin/time -v -o "$dir.time" .venv/bin/agentcap fit --config "${CONFIG:-configs/real/$name.yaml}" ${FLAGS:-} \
        --seed_everything "$seed" --model.seed "$seed" --model.run_dir "$dir" \
        --trainer.logger.init_args.save_dir "$dir" > "$dir.log" 2>&1 &
  done
  wait
fi
case "$name" in
  acecap) pairs=S1:S2,S2:S3,S3:S4,S4:S5,S1:S5 ;;  # each stage's own change, and the whole
  *) pairs=before_grpo:after_grpo ;;
esac
.venv/bin/python tools/seed_stats.py "$name" "$@" --pairs "${PAIRS:-$pairs}" --root "$runs" | tee "$runs/$name-seeds.md"
