#!/usr/bin/env bash
# Run one offline demo over several seeds, then print each held-out metric's mean over seeds with a
# 95 % interval and the paired before/after differences (tools/seed_stats.py; also runs/NAME-seeds.md).
# Seeds 0, 1, 2 were used to tune the demo recipes: report gains on others.
#   bash tools/seeds.sh read 5 6 7
#   SKIP_RUNS=1 bash tools/seeds.sh read 5 6 7     (only the tables, from finished runs)
#   DEMO_FLAGS="--model.eval_limit 30" bash tools/seeds.sh acecap 5 6 7
#   RUNS=runs/short CONFIG=configs/demo/acecap-short.yaml bash tools/seeds.sh acecap 5 6 7
#   RUNS: where the runs go (default runs/); CONFIG: the recipe in place of configs/demo/NAME.yaml;
#   PAIRS: the BEFORE:AFTER stages to pair (default: the demo's own); JOBS: seeds run at once
#   (default 1; each seed is its own process with one intra-op thread)
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: tools/seeds.sh read|audiomap|acecap SEED...}
shift
runs=${RUNS:-runs}
mkdir -p "$runs"
jobs=${JOBS:-1}
case "$jobs" in ''|*[!0-9]*|0) echo "JOBS='$jobs': expected a count of parallel runs (1 or more)" >&2; exit 2 ;; esac
run_seed() {
  local seed=$1 start
  start=$(date +%s)
  rm -rf "$runs/$name-demo-s$seed"  # a fresh run, not a resume of an older one
  # shellcheck disable=SC2086  # DEMO_FLAGS: extra `agentcap fit` flags, e.g. "--config short.yaml"
  DEMO_STEP=fit bash tools/demo.sh "$name" ${DEMO_FLAGS:-} --seed_everything "$seed" --model.seed "$seed" \
      --model.run_dir "$runs/$name-demo-s$seed" --trainer.logger.init_args.save_dir "$runs/$name-demo-s$seed" \
      > "$runs/$name-demo-s$seed.log" 2>&1 || { echo "seed $seed: failed, see $runs/$name-demo-s$seed.log" >&2; return 1; }
  echo "seed $seed: $(( $(date +%s) - start )) s"
}
if [ -z "${SKIP_RUNS:-}" ]; then
  # the toy world once, before any fit reads it: parallel seeds must not regenerate it under each other
  DEMO_STEP=prepare bash tools/demo.sh "$name"
  # JOBS: seeds run at once (one intra-op thread each; a 2-core machine takes 2-3)
  pids=()
  for seed in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run_seed "$seed" &
    pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || exit 1
fi
case "$name" in
  acecap) pairs=S1:S4,S1:S5,S4:S5,S1_sampled:S5_sampled ;;
  *) pairs=before_grpo:after_grpo,before_grpo_sampled:after_grpo_sampled ;;
esac
pairs=${PAIRS:-$pairs}  # e.g. PAIRS=S1:S5
.venv/bin/python tools/seed_stats.py "$name" "$@" --pairs "$pairs" --root "$runs" | tee "$runs/$name-seeds.md"
