#!/usr/bin/env bash
# Dependency parsing (issue 15): a biaffine parser on minilm, trained on UD English-EWT dev, scored on EWT test.
# Usage: benchmarks/parsing.sh OUT_DIR   (run from the repository root; CPU; writes OUT_DIR/ft)
set -euo pipefail
OUT=${1:-/tmp/bertology-parsing-bench}
UD=${UD:-../../shared/data/ud}
PY=${PY:-/work/main/.venv/bin/python}
export HF_HUB_OFFLINE=1 PYTHONPATH=src
/usr/bin/time -v "$PY" -m bertology finetune --task parsing --model minilm \
  --data "$UD/en_ewt-ud-dev.conllu" --eval-data "$UD/en_ewt-ud-test.conllu" \
  --epochs 2 --batch-size 16 --lr 1e-4 --seed 0 --out "$OUT/ft" --no-report --overwrite
