#!/usr/bin/env bash
# Issue 18 on a machine with a GPU, in one call (the device time is short): from the repository root,
#   IN=gpu_in OUT=/some/dir benchmarks/gpu_issue18.sh
# IN holds dev.tsv (GLUE SST-2 dev), train4000.tsv (its first 4,000 training sentences), tok/ (the
# packaged MiniLM tokenizer, saved with save_pretrained) and old/src (a `git archive <commit> src` of
# the tree to compare against). What it runs, all at BERT-base size (random init, no download):
#  1. on cores 0-1 with 2 threads, in the background: bare forward vs compare (6 streaming analyses)
#     on the CPU, old tree and this tree alternately, ROUNDS rounds (a quiet 2-core stand-in for
#     our development machine, where other sessions' load makes single rounds unreliable);
#  2. on the other cores and the GPU: the same ratio on cuda in float32 and bfloat16 (3 rounds, profiled),
#     compare's peak memory for 500 vs 4,000 sentences (fresh process each), and the ablation sweep
#     cached vs naive (144 heads + 12 layers x 2 modes, uniform) with head importance.
set -uo pipefail
in=${IN:-gpu_in}
out=${OUT:?OUT=output folder}
py=${PYTHON:-python3}
export TOKENIZERS_PARALLELISM=false
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
$py -c "import sys, torch, transformers, numpy, scipy, sklearn, numba; print(sys.version); print({m.__name__: m.__version__ for m in (torch, transformers, numpy, scipy, sklearn, numba)}); print('cpus', __import__('os').cpu_count())" > "$out/versions.txt" 2>&1

# A quick check of this script on a CPU-only machine: DEVICE=cpu SIZE=small ABLATE=0 OUT=/tmp/x benchmarks/gpu_issue18.sh
# Pin the CPU rounds to cores 0-1 and the rest to the other cores (only where there are 4 or more).
if [ "$(nproc)" -ge 4 ]; then pin_cpu="taskset -c 0,1"; pin_gpu="taskset -c 2-$(( $(nproc) - 1 ))"; else pin_cpu=; pin_gpu=; fi
cpu_ab() {
  for r in $(seq 1 "${ROUNDS:-1}"); do
    for tree in old new; do
      src=$([ $tree = old ] && echo "$in/old/src" || echo src)
      echo "== round $r $tree $(date -u +%H:%M:%S)"
      PYTHONPATH=$src OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 NUMBA_NUM_THREADS=2 $pin_cpu \
        $py benchmarks/scale_gpu.py --data "$in/dev.tsv" --n 500 --size "${SIZE:-base}" --device cpu --dtypes float32 \
        --repeats 1 --tokenizer "$in/tok" --out "$out/cpu-$tree-$r.json" 2>&1 | grep -v "Loading\|Writing"
    done
  done
}
cpu_ab > "$out/cpu_ab.log" 2>&1 &
ab=$!

gpu() { PYTHONPATH=src $pin_gpu "$py" "$@"; }
echo "== gpu e2e $(date -u +%H:%M:%S)"
gpu benchmarks/scale_gpu.py --data "$in/dev.tsv" --n 500 --size "${SIZE:-base}" --device "${DEVICE:-cuda}" --tokenizer "$in/tok" --repeats 3 \
  --dtypes float32,bfloat16 --profile 30 --out "$out/scale_gpu.json" > "$out/scale_gpu.log" 2>&1
for n in 500 4000; do
  echo "== gpu memory $n $(date -u +%H:%M:%S)"
  gpu benchmarks/scale_gpu.py --data "$in/train4000.tsv" --n $n --size "${SIZE:-base}" --device "${DEVICE:-cuda}" --tokenizer "$in/tok" --dtypes float32 \
    --repeats 1 --methods compare --no-warmup --out "$out/mem-$n.json" > "$out/mem-$n.log" 2>&1
done
echo "== gpu ablation $(date -u +%H:%M:%S)"
[ "${ABLATE:-1}" = 0 ] || gpu benchmarks/ablation.py --random-bert-base --tokenizer "$in/tok" --data "$in/dev.tsv" --n "${ABLATE_N:-256}" \
  --repeats 2 --device "${DEVICE:-cuda}" --out-dir "$out" --out-name ablation-bertbase-gpu > "$out/ablation.log" 2>&1
echo "== waiting for the CPU rounds $(date -u +%H:%M:%S)"
wait $ab
echo "== done $(date -u +%H:%M:%S)"
