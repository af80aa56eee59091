#!/usr/bin/env bash
# Run one offline demo over several seeds and print each held-out summary side by side.
#   bash tools/seeds.sh read 0 1 2
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: tools/seeds.sh read|audiomap|acecap SEED...}
shift
for seed in "$@"; do
  start=$(date +%s)
  rm -rf "runs/$name-demo-s$seed"  # a fresh run, not a resume of an older one
  bash tools/demo.sh "$name" --seed_everything "$seed" --model.seed "$seed" \
      --model.run_dir "runs/$name-demo-s$seed" --trainer.logger.init_args.save_dir "runs/$name-demo-s$seed" \
      > "runs/$name-demo-s$seed.log" 2>&1
  echo "seed $seed: $(( $(date +%s) - start )) s"
done
.venv/bin/python - "$name" "$@" <<'PY'
import json, sys
name, seeds = sys.argv[1], sys.argv[2:]
runs = {s: json.load(open(f"runs/{name}-demo-s{s}/summary.json")) for s in seeds}
stages = list(next(iter(runs.values())))
metrics = sorted({m for r in runs.values() for st in r.values() for m in st})
print("| stage | metric | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
print("|---|---|" + "---|" * (len(seeds) + 1))
for stage in stages:
    for m in metrics:
        vals = [runs[s][stage].get(m) for s in seeds]
        if any(v is None for v in vals):
            continue
        print(f"| {stage} | {m} | " + " | ".join(f"{v:.3f}" for v in vals) + f" | {sum(vals) / len(vals):.3f} |")
PY
