#!/usr/bin/env bash
# Rehearses tools/gpu-check.sh here, without a GPU, the way the GPU machine will see it: a
# copy of the working tree (tracked and untracked, not ignored files, as the device tool
# sends) with .gpu-carry/ (tools/gpu-pack.sh), no build folder, and this checkout's .venv
# hidden behind an empty folder, so that the binaries must load LibTorch, CUDA and NCCL
# from the PyTorch of `python3` (the venv, mounted elsewhere) and everything else from
# .gpu-carry/lib, as they will there. Needs root (a private mount namespace). This
# machine's /usr/lib stays visible, so a Debian library missing from the pack is not caught.
#
# Passes when every binary loaded and ran, the GPU-free suite passed, and each CUDA part
# stopped within seconds naming the missing GPU: what it cannot tell is whether the CUDA
# paths work, which only the GPU machine shows.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ -d .gpu-carry/bin ] || { echo "gpu-rehearse: run tools/gpu-pack.sh first" >&2; exit 2; }
[ -x .venv/bin/python ] || { echo "gpu-rehearse: no .venv; run tools/setup.sh first" >&2; exit 2; }
WORK=$(mktemp -d /tmp/gpu-rehearse.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/tree" "$WORK/venv" "$WORK/out"
git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$WORK/tree"
cp -r .gpu-carry "$WORK/tree/"
unshare -m --propagation private bash -c '
  set -e
  mount --bind "$1/.venv" "$2/venv"
  mount -t tmpfs none "$1/.venv"
  cd "$2/tree"
  PATH=$2/venv/bin:$PATH OUT=$2/out timeout 600 bash tools/gpu-check.sh
' rehearse "$ROOT" "$WORK" > "$WORK/check.log" 2>&1 || true
cat "$WORK/check.log"

problems=0
complain() { echo "gpu-rehearse: $*"; problems=1; }
if grep -l -E 'error while loading shared libraries|cannot open shared object' "$WORK"/out/*.log \
     "$WORK/check.log" 2>/dev/null; then
  complain "a binary could not load a library (files above): gpu-pack.sh misses it"
fi
grep -q '^== test_nccl: exit 0 ' "$WORK/check.log" || complain "test_nccl (no GPU needed) did not pass"
while read -r name seconds; do
  [ "$seconds" -le 30 ] || complain "$name took $seconds s without a GPU; it should stop at once"
done < <(sed -n -E 's/^== ([a-z_0-9]+): exit [0-9]+ in ([0-9]+) s$/\1 \2/p' "$WORK/check.log")
for part in coll_tdist_nccl coll_tdist_gloo train_tdist_single train_tdist_fsdp train_tdist_offload; do
  grep -q -i 'no CUDA GPU' "$WORK/out/$part.log" || complain "$part did not name the missing GPU"
done
[ "$problems" -eq 0 ] && echo "gpu-rehearse: ok (every binary loaded; the CUDA parts stopped naming the missing GPU)"
exit "$problems"
