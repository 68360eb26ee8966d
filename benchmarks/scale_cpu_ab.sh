#!/usr/bin/env bash
# Issue 18, item 1 on the CPU: the old tree and this tree alternately, one process each per round, each
# timing the bare forward and compare (6 streaming analyses) at BERT-base size on the same 500 SST-2
# sentences, keeping the tables so their numbers can be compared (table_diff.py).
#   OLD=/tmp/old-tree (a `git archive <commit> src` export) ROUNDS=1 [SIZE=base-2layers] benchmarks/scale_cpu_ab.sh OUTDIR
set -euo pipefail
out=${1:?output folder}
old=${OLD:?OLD=the old tree (with src/)}
py=${PYTHON:-/work/main/.venv/bin/python}
data=${DATA:-/work/shared/data/glue/SST-2/dev.tsv}
mkdir -p "$out"
for r in $(seq 1 "${ROUNDS:-1}"); do
  for tree in old new; do
    src=$([ $tree = old ] && echo "$old/src" || echo "${NEW:-$PWD}/src")
    echo "== round $r $tree $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$src "$py" benchmarks/scale_gpu.py --data "$data" --n 500 --size "${SIZE:-base}" --device cpu --dtypes float32 --repeats 1 \
      --keep-tables "$out/tables-$tree-$r" --out "$out/$tree-$r.json" ${PROFILE:+--profile $PROFILE} 2>&1 | grep -v "Loading\|Writing"
  done
done
