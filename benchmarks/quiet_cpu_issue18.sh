#!/usr/bin/env bash
# Issue 18 on a quiet many-core machine (the device machine's CPUs), in one short call: each job pinned to
# its own pair of cores with 2 threads, as our 2-core development machine has, all at once:
#   cores 0-1: this tree, bare forward vs compare (6 streaming analyses), BERT-base size, 500 SST-2 sentences,
#              with the manifest's per-analysis timings;
#   cores 2-3: the same with the old tree (IN/old/src, a `git archive <commit> src`);
#   cores 4-5: this tree again, profiled (cProfile, top 40);
#   cores 6-7: the ablation sweep at BERT-base on the CPU, cached vs naive, 8 sentences (bit-identity, ratio).
#   IN=gpu_in OUT=/some/dir benchmarks/quiet_cpu_issue18.sh
# Jobs share the memory bus and caches, so compare the ratios within a job, not seconds across jobs.
set -uo pipefail
in=${IN:-gpu_in}
out=${OUT:?OUT=output folder}
py=${PYTHON:-python3}
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 NUMBA_NUM_THREADS=2
limit=${LIMIT:-185}  # each job is stopped after this many seconds, so the files are packed before the call's limit
w="$out/w"
mkdir -p "$w"
e2e() {  # cores src name [extra args]
  local cores=$1 src=$2 name=$3; shift 3
  PYTHONPATH=$src timeout "$limit" taskset -c "$cores" "$py" benchmarks/scale_gpu.py --data "$in/dev.tsv" --n 500 --size "${SIZE:-base}" \
    --device cpu --dtypes float32 --repeats 1 --tokenizer "$in/tok" --out "$w/$name.json" "$@" 2>&1 | grep -v "Loading\|Writing" > "$w/$name.log"
}
e2e 0,1 src new &
e2e 2,3 "$in/old/src" old &
e2e 4,5 src new-profiled --profile 40 &
[ "${ABLATE:-1}" = 0 ] || PYTHONPATH=src timeout "$limit" taskset -c 6,7 "$py" benchmarks/ablation.py --random-bert-base --tokenizer "$in/tok" \
  --data "$in/dev.tsv" --n 8 --repeats 1 --device cpu --out-dir "$w" --out-name ablation-bertbase-cpu > "$w/ablation.log" 2>&1 &
wait
tar -czf "$out/all.tgz" -C "$w" .  # one file back, whatever the count
