#!/usr/bin/env bash
# The GPU checks, on the one-H200 machine (see tools/gpu-pack.sh, which builds what this runs
# and says how to send it). Runs the NCCL backend's suites against that machine's PyTorch:
# test_nccl (the unit tests, now with a GPU present), test_nccl_cuda (world 1 over NCCL) and
# test_gloo_cuda (worlds 2 and 3 sharing the GPU over Gloo: NCCL refuses two ranks on one
# GPU). Each suite's log goes to $OUT. Exit status: non-zero if any suite failed or skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
[ -d .gpu-carry/bin ] || { echo "gpu-check: .gpu-carry/ is missing; run tools/gpu-pack.sh here and carry it" >&2; exit 2; }
TORCH_DIR=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
SITE=$(dirname "$TORCH_DIR")
LIBS=.gpu-carry/lib:$TORCH_DIR/lib
for d in "$SITE"/nvidia/*/lib "$SITE"/nvidia/cu13/lib; do [ -d "$d" ] && LIBS=$LIBS:$d; done
export LD_LIBRARY_PATH=$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_NUM_THREADS=1
nvidia-smi -L
python3 -c 'import torch; print("torch", torch.__version__, "built for", open(".gpu-carry/torch-version.txt").read().strip(), "|", torch.cuda.get_device_name(0))'
status=0
for suite in test_nccl test_nccl_cuda test_gloo_cuda; do
  start=$(date +%s)
  timeout 240 ".gpu-carry/bin/$suite" > "$OUT/$suite.log" 2>&1
  rc=$?
  echo "== $suite: exit $rc in $(( $(date +%s) - start )) s"
  grep -E '^\[  (FAILED|SKIPPED) |^\[  PASSED|tests ran' "$OUT/$suite.log" | tail -15
  [ "$rc" -eq 0 ] || status=1
done
exit $status
