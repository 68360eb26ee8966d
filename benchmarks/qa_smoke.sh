#!/usr/bin/env bash
# Extractive QA smoke run on minilm, CPU (issue 15, item 4): finetune --task qa on the SQuAD v2.0 fixture of
# bertology.testing (squad_fixture: 3 paragraphs, 2 answerable + 1 unanswerable question each), repeated
# COPIES times as separate articles, then ablate the QA model on the same file.
# Usage: benchmarks/qa_smoke.sh OUT_DIR [COPIES]   (run from the repository root)
set -euo pipefail
OUT=${1:?usage: qa_smoke.sh OUT_DIR [COPIES]}
COPIES=${2:-8}
PY=${PYTHON:-python}
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
$PY -c "import json, sys; from bertology.testing import squad_fixture; json.dump(squad_fixture('v2.0', copies=$COPIES), open(sys.argv[1], 'w'))" "$OUT/squad.json"
/usr/bin/time -f "finetune wall %e s, max RSS %M kB" $PY -m bertology finetune --task qa --model minilm --data "$OUT/squad.json" \
    --max-length 64 --doc-stride 16 --epochs 4 --batch-size 8 --lr 1e-4 --seed 0 --out "$OUT/ft" --no-report --overwrite
/usr/bin/time -f "ablate wall %e s, max RSS %M kB" $PY -m bertology ablate --model "$OUT/ft/model" --data "$OUT/squad.json" \
    --max-length 64 --doc-stride 16 --bootstrap 1000 --max-examples 0 --out "$OUT/ablate" --no-report --overwrite
