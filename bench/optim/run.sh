#!/bin/sh
# The optimizer step side by side: tdist::optim's for-loop, foreach and fused (and
# LibTorch's torch::optim) against torch.optim's, the same shapes, parameters, gradients,
# steps and threads; each tdist row's time over PyTorch's same implementation, and whether
# the parameters after the steps agree (checksums within 1e-6 relative).
#   sh bench/optim/run.sh [build-dir] [--smoke] [--device cuda] [--threads T]
# Exits 1 when the two sides' checksums disagree.
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
here=$(cd "$(dirname "$0")" && pwd)
python=${TDIST_PYTHON:-$here/../../.venv/bin/python}
bin="$build/bench/optim/bench_optim"
[ -x "$bin" ] || { echo "no $bin: build it with cmake --build $build --target bench_optim" >&2; exit 1; }
flags="--steps 10 --rounds 5"
if [ "${1:-}" = "--smoke" ]; then flags="--steps 1 --rounds 1"; shift; fi
flags="$flags $*"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for opt in adamw adam sgd; do
  "$bin" "$here/shapes.txt" --optimizer $opt $flags | sed 's/^/tdist /' >> "$out"
  "$python" "$here/optim_torch.py" "$here/shapes.txt" --optimizer $opt $flags | sed 's/^/torch /' >> "$out"
done
"$python" - "$out" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    side, _, text = line.partition(" ")
    r = json.loads(text)
    rows[(side, r["optimizer"], r["impl"])] = r
ok = True
print("%-9s %-9s %10s %12s %9s %s" % ("optimizer", "impl", "tdist ms", "pytorch ms",
                                      "tdist/pt", "same params"))
for opt in ("adamw", "adam", "sgd"):
    ref = rows[("torch", opt, "for-loop")]["checksum"]
    for impl in ("for-loop", "foreach", "fused", "libtorch"):
        t = rows[("tdist", opt, impl)]
        p = rows.get(("torch", opt, impl if impl != "libtorch" else "for-loop"))
        same = abs(t["checksum"] - ref) <= 1e-6 * max(1.0, abs(ref))
        ok = ok and same
        print("%-9s %-9s %10.3f %12.3f %9.2f %s" % (opt, impl, t["ms"], p["ms"],
                                                 t["ms"] / p["ms"], "yes" if same else "NO"))
print("(libtorch: LibTorch's torch::optim, against torch.optim's for-loop)")
sys.exit(0 if ok else 1)
PY
