#!/bin/bash
# Interleaved A/B of the extraction engine: old (a worktree of 2182945 at /tmp/old: git worktree add /tmp/old 2182945) vs this tree.
cd /work/main
for round in 1 2 3 4 5; do
  for v in old new; do
    if [ $v = old ]; then PP=/tmp/old/src; B=/tmp/old/benchmarks/extract.py; else PP=/work/main/src; B=/work/main/benchmarks/extract.py; fi
    BERTOLOGY_CACHE=/work/main/.cache PYTHONPATH=$PP .venv/bin/python $B --n 500 --repeats 1 --warmup-n 64 --loop-n 16 --no-memory --out /tmp/bench-$v-$round.json > /tmp/bench-$v-$round.log 2>&1
  done
done
echo finished
