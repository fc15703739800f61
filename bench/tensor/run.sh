#!/bin/sh
# Tensor parallelism side by side with PyTorch's (bench/RESULTS.md, "Tensor parallelism"): the
# same transformers Llama folder, plan (torchtitan's: MODE plain, replicated logits; sp,
# sequence parallelism and loss_parallel), batch and for-loop AdamW at WORLD ranks over gloo
# on the CPU; ROUNDS alternating runs of each side.
#   sh bench/tensor/run.sh [build-dir] [WORLD] [ROUNDS] [MODE]
# Exits 1 when the first steps' losses disagree or tdist's bytes miss the formula by > 1%.
set -eu
build=${1:-build}
world=${2:-4}
rounds=${3:-3}
mode=${4:-plain}
here=$(cd "$(dirname "$0")" && pwd)
python=${TDIST_PYTHON:-$here/../../.venv/bin/python}
bin="$build/bench/tensor/bench_tensor_parallel"
[ -x "$bin" ] || { echo "no $bin: build it with ninja -C $build bench_tensor_parallel" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" "$here/make_model.py" "$work/model"
batch=4 seq=128 steps=5 warmup=2
for i in $(seq "$rounds"); do
  OMP_NUM_THREADS=1 "$build/tools/tdistrun/tdistrun" --standalone --nproc-per-node "$world" \
    "$bin" "$work/model" $batch $seq $steps $warmup "$mode" | sed -n 's/^.*\({"impl".*\)$/\1/p' >> "$work/rows"
  OMP_NUM_THREADS=1 "$python" "$here/tp_torch.py" "$work/model" $batch $seq $steps $warmup \
    "$world" "$mode" | sed -n 's/^.*\({"impl".*\)$/\1/p' >> "$work/rows"
done
exec "$python" - "$work/rows" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
t = [r for r in rows if r["impl"] == "tdist"]
p = [r for r in rows if r["impl"] == "pytorch"]
tm = statistics.median(r["step_ms_median"] for r in t)
pm = statistics.median(r["step_ms_median"] for r in p)
ratios = sorted(b["step_ms_median"] / a["step_ms_median"] for a, b in zip(t, p))
print("%s plan, " % t[0]["mode"], end="")
print("world %d, %d rounds: tdist step %.1f ms, PyTorch %.1f ms; tdist step rate %.2fx PyTorch's"
      " (per round %s)" % (t[0]["world"], len(t), tm, pm, pm / tm,
                            ", ".join("%.2f" % r for r in ratios)))
sent, formula = t[0]["bytes_sent"], t[0]["bytes_formula"]
print("bytes sent per rank per step: %.0f, formula %.0f (%.3f%%)" %
      (sent, formula, 100 * (sent - formula) / formula))
print("final losses: tdist %.6f, PyTorch %.6f" % (t[0]["loss"], p[0]["loss"]))
ok = abs(sent - formula) <= 0.01 * formula and t[0]["float32"]
ok = ok and abs(t[0]["loss"] - p[0]["loss"]) <= 1e-4 * abs(p[0]["loss"])
sys.exit(0 if ok else 1)
PY
