#!/usr/bin/env bash
# Issue 35 on a machine with a GPU, in one call (device time is short): from the repository root,
#   IN=gpu_in OUT=/some/dir benchmarks/gpu.sh
# IN holds dev.tsv (GLUE SST-2 dev, a 'sentence' column) and, optionally, tok/ (the packaged MiniLM tokenizer,
# saved with save_pretrained; without it scale_gpu.py loads the packaged one). Everything it writes goes to OUT:
#  1. versions.txt, nvidia-smi.txt;
#  2. tests-device.log/.xml: the model-running tests on the GPU, BERTOLOGY_TEST_DEVICE=cuda (the family
#     captures and commands, tests/families/test_adapters.py and test_family_cli.py, and tests/unit/test_precision.py);
#  3. tests-cuda-only.log/.xml: the tests that skip without CUDA (their names hold "on_a_gpu": relation heads scored
#     where the maps are; representation_similarity and attention_change kept and computed on the GPU, against the CPU);
#  4. scale-<size>.json/.log: benchmarks/scale_gpu.py, compare vs the bare forward in float32 and bfloat16, at
#     BERT-base and BERT-large size (random init, no download), with each method's peak device memory;
#  5. status.txt: each step's exit code (a failed step does not stop the next).
# Each step runs under its own time limit (seconds: TESTS_S, SCALE_S), so one hang cannot eat the others' device
# time. N (sentences, default 500), REPEATS (default 2), SIZES (default "base large") size the benchmark.
# A check of this script on a CPU-only machine (the CUDA-only tests skip there):
#   DEVICE=cpu SIZES=small N=40 REPEATS=1 OUT=/tmp/x benchmarks/gpu.sh
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
step tests-cuda-only "${TESTS_S:-240}" $py -m pytest -q -rs -p no:cacheprovider -k on_a_gpu \
  tests/unit/test_similarity_torch.py tests/unit/test_relation_heads.py --junitxml "$out/tests-cuda-only.xml"

tok=()
[ -d "$in/tok" ] && tok=(--tokenizer "$in/tok")
for size in ${SIZES:-base large}; do
  step "scale-$size" "${SCALE_S:-300}" $py benchmarks/scale_gpu.py --data "$in/dev.tsv" --n "${N:-500}" --size "$size" \
    --device "$device" --dtypes float32,bfloat16 --repeats "${REPEATS:-2}" ${tok[@]+"${tok[@]}"} --out "$out/scale-$size.json"
done
echo "== done $(date -u +%H:%M:%S)"
cat "$out/status.txt"
