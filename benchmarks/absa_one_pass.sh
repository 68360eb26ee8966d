#!/usr/bin/env bash
# `bertology absa` before (main at d1c2514: the held-out pairs streamed twice, once for the ABSA heads and
# once for compare's attention change) and after (one pass feeds both), same settings, alternating runs.
# Fine-tuning is skipped (--tuned minilm) so the time is the analysis part. Usage:
#   benchmarks/absa_one_pass.sh OLD_SRC NEW_SRC [REPEATS]
# e.g. benchmarks/absa_one_pass.sh /work/main/src src 2
set -euo pipefail
OLD=${1:?old src}; NEW=${2:?new src}; REPEATS=${3:-2}
PY=${PY:-/work/main/.venv/bin/python}
DATA=${DATA:-/work/shared/data/absa/Restaurants_Train_v2.xml}
ARGS=(absa --data "$DATA" --base minilm --tuned minilm --max-sentences 240 --eval-fraction 0.5
      --analysis-pairs 400 --max-length 64 --batch-size 32 --no-opinions --view-examples 0 --no-report)
for r in $(seq "$REPEATS"); do
  for side in old new; do
    src=$OLD; [ "$side" = new ] && src=$NEW
    out=$(mktemp -d)
    load=$(cut -d' ' -f1 /proc/loadavg)
    # wall and CPU (user + sys) seconds: on a shared machine the CPU time is the steadier of the two
    PYTHONPATH=$src HF_HUB_OFFLINE=1 "$PY" - "$out" "${ARGS[@]}" <<'PYEOF' | sed "s/^/$side run $r: /; s/\$/ (load before $load)/"
import resource, subprocess, sys, time
out, args = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
subprocess.run([sys.executable, "-m", "bertology", *args, "--out", out], check=True, capture_output=True)
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"wall {time.perf_counter() - t0:.1f} s, cpu {ru.ru_utime + ru.ru_stime:.1f} s")
PYEOF
    rm -rf "$out"
  done
done
