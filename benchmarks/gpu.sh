#!/usr/bin/env bash
# Issue 35 on a machine with a GPU, in one call (device time is short): from the repository root,
#   IN=gpu_in OUT=/some/dir benchmarks/gpu.sh
# IN holds dev.tsv (GLUE SST-2 dev, a 'sentence' column; 4,000 rows or more for the 4,000-sentence run: e.g.
# SST-2 train's first rows) and, optionally, tok/ (the packaged MiniLM tokenizer, saved with save_pretrained;
# without it scale_gpu.py loads the packaged one). Everything it writes goes to OUT:
#  1. versions.txt, nvidia-smi.txt;
#  2. tests-device.log/.xml: the model-running tests on the GPU, BERTOLOGY_TEST_DEVICE=cuda (the family
#     captures and commands, tests/families/test_adapters.py and test_family_cli.py, and tests/unit/test_precision.py);
#  3. tests-cuda-only.log/.xml: every unit test that skips without CUDA (names holding "on_a_gpu" or "cuda": the
#     analyses kept and computed on the GPU against the CPU's tables, relation heads, the manifest's peak memory);
#  4. scale-<size>-<n>.json/.log: benchmarks/scale_gpu.py, compare vs the bare forward in float32 and bfloat16
#     (interleaved rounds), at each SIZE:N of RUNS (default "base:500 base:4000 large:500"; random init, no
#     download), with each method's peak device memory; the first run keeps its tables (tables-<size>-<n>/);
#  5. cpu-reference.log and table-check.log: the first run's compare once more on the CPU (float32, one round), and
#     benchmarks/table_diff.py --rtol RTOL (default 1e-3) of the GPU's float32 tables against it;
#  6. ablation-units.json/.log: benchmarks/ablation.py, the cached sweep at BERT-base with 1 vs 8 head units per
#     forward (issue 35, item 3), interleaved, 128 labelled sentences of dev.tsv (it needs a 'label' column);
#  7. status.txt: each step's exit code (a failed step does not stop the next).
# Each step runs under its own time limit (seconds: TESTS_S, SCALE_S, CPU_S), so one hang cannot eat the others'
# device time (ABLATION_S for 6). REPEATS (default 2) sets the rounds per dtype.
# The default limits add up to ~31 min, more than a 15-minute device lease: size a call with RUNS, REPEATS=1 and
# the *_S limits (e.g. RUNS="base:500 base:4000" REPEATS=1 SCALE_S=200 CPU_S=150).
# A check of this script on a CPU-only machine (the CUDA-only tests skip there):
#   DEVICE=cpu RUNS=small:40 REPEATS=1 OUT=/tmp/x benchmarks/gpu.sh
set -uo pipefail
in=${IN:-gpu_in}
out=${OUT:?OUT=output folder}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$out"
: > "$out/status.txt"
step() {  # step NAME SECONDS COMMAND...: run, log, record the exit code
  local name=$1 limit=$2
  shift 2
  echo "== $name $(date -u +%H:%M:%S)"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "$name $?" >> "$out/status.txt"
}
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
$py -c "import sys, torch, transformers, numpy, scipy, numba; print(sys.version); print({m.__name__: m.__version__ for m in (torch, transformers, numpy, scipy, numba)}); print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else None); print('cpus', __import__('os').cpu_count())" > "$out/versions.txt" 2>&1

BERTOLOGY_TEST_DEVICE=$device step tests-device "${TESTS_S:-240}" $py -m pytest -q -rs -p no:cacheprovider \
  tests/families/test_adapters.py tests/families/test_family_cli.py tests/unit/test_precision.py --junitxml "$out/tests-device.xml"
step tests-cuda-only "${TESTS_S:-240}" $py -m pytest -q -rs -p no:cacheprovider -k "on_a_gpu or cuda" \
  tests/unit --junitxml "$out/tests-cuda-only.xml"

tok=()
[ -d "$in/tok" ] && tok=(--tokenizer "$in/tok")
runs=(${RUNS:-base:500 base:4000 large:500})
first=${runs[0]}
for run in "${runs[@]}"; do
  size=${run%%:*} n=${run##*:}
  keep=()
  [ "$run" = "$first" ] && keep=(--keep-tables "$out/tables-$size-$n")
  step "scale-$size-$n" "${SCALE_S:-300}" $py benchmarks/scale_gpu.py --data "$in/dev.tsv" --n "$n" --size "$size" \
    --device "$device" --dtypes float32,bfloat16 --repeats "${REPEATS:-2}" ${tok[@]+"${tok[@]}"} ${keep[@]+"${keep[@]}"} \
    --out "$out/scale-$size-$n.json"
done
# the same models and corpus on the CPU, float32, one round: the reference the GPU's tables are checked against
size=${first%%:*} n=${first##*:}
step cpu-reference "${CPU_S:-240}" $py benchmarks/scale_gpu.py --data "$in/dev.tsv" --n "$n" --size "$size" --device cpu \
  --dtypes float32 --repeats 1 --methods compare --no-warmup ${tok[@]+"${tok[@]}"} --keep-tables "$out/cpu-tables" \
  --out "$out/cpu-reference.json"
step table-check 60 $py benchmarks/table_diff.py "$out/tables-$size-$n/float32-0" "$out/cpu-tables/float32-0" \
  --rtol "${RTOL:-1e-3}"
step ablation-units "${ABLATION_S:-240}" $py benchmarks/ablation.py $([ "$device" = cpu ] && echo --random-small || echo --random-bert-base) \
  --data "$in/dev.tsv" --n "${ABLATION_N:-128}" --device "$device" --units-per-forward "${UNITS:-8}" --repeats 2 \
  ${tok[@]+"${tok[@]}"} --out-dir "$out" --out-name ablation-units
echo "== done $(date -u +%H:%M:%S)"
cat "$out/status.txt"
