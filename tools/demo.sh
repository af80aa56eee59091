#!/usr/bin/env bash
# Run one offline demo end to end: make the toy world, train what the recipe needs, then fit.
#   bash tools/demo.sh read | audiomap | acecap   [extra `agentcap fit` flags]
#   DEMO_STEP=prepare (only the toy world and the READ scorer) or fit (only the fit); default both
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: tools/demo.sh read|audiomap|acecap [agentcap fit flags]}
shift
PY=.venv/bin/python
# tiny models: one intra-op thread is several times faster than two contending threads here
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# the same bits on any x86 machine with AVX2: without these, ATen's kernels and MKL's GEMMs pick the
# widest instruction set the CPU has (AVX-512 here, AVX2 there) and round differently, and one
# flipped sampled token moves every later figure (docs/implementation-details.md 27)
export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2} MKL_CBWR=${MKL_CBWR:-AVX2} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX2}
step=${DEMO_STEP:-all}
case "$step" in all|prepare|fit) ;; *) echo "DEMO_STEP='$step': expected all, prepare or fit" >&2; exit 2 ;; esac
case "$name" in read|audiomap|acecap) ;; *) echo "unknown demo '$name' (read, audiomap, acecap)" >&2; exit 2 ;; esac
[ "$step" = fit ] || case "$name" in
  read)
    $PY tools/make_toy_movie.py --out data/toy_movie
    [ -f runs/read-demo/scorer/config.json ] || $PY tools/train_coherence_scorer.py \
        --corpus data/toy_movie/corpus.jsonl --tiny \
        --out runs/read-demo/scorer --lr 3e-3 --batch-size 16 --grad-accum 1 --max-steps 150
    ;;
  audiomap|acecap)
    $PY tools/make_toy_soundscapes.py --out data/toy_soundscapes
    ;;
esac
[ "$step" = prepare ] && exit 0
# CONFIG: another recipe of this demo in place of configs/demo/NAME.yaml (e.g. configs/demo/acecap-short.yaml)
exec .venv/bin/agentcap fit --config "${CONFIG:-configs/demo/$name.yaml}" "$@"
