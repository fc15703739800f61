#!/usr/bin/env bash
# Packs what tools/gpu-check.sh runs on the GPU machine into .gpu-carry/ (git-ignored): the
# GPU test and benchmark binaries built here (stripped) and the Debian libraries they load
# that PyTorch's wheel does not bring. That machine has no network and none of tdist's build
# dependencies, but the same PyTorch (2.11.0+cu130) as tools/torch-version.txt, whose
# LibTorch the binaries were linked against. Then, on a task lent a GPU:
#   run(command="bash tools/gpu-check.sh", carry=[".gpu-carry"], timeout_s=540)
# (the check keeps to its own 480 s budget, GPU_CHECK_BUDGET_S, so the tables come back).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
BINARIES=(tests/nccl/test_nccl tests/nccl/test_nccl_cuda tests/nccl/test_gloo_cuda
          tests/train_cuda/test_train_cuda tests/gpt/test_gpt tests/models/test_models
          bench/collectives/bench_gpu_collectives bench/train/bench_train)
targets=()
for b in "${BINARIES[@]}"; do targets+=("$(basename "$b")"); done
cmake --build "$BUILD_DIR" -j2 --target "${targets[@]}"
rm -rf .gpu-carry
mkdir -p .gpu-carry/bin .gpu-carry/lib
for b in "${BINARIES[@]}"; do
  strip -o ".gpu-carry/bin/$(basename "$b")" "$BUILD_DIR/$b"
done
# Everything the binaries (and the Gloo module they load from memory, on libgloo) resolve
# outside LibTorch, NVIDIA's libraries and the C/C++ runtime.
{
  for b in "${BINARIES[@]}"; do ldd "$BUILD_DIR/$b"; done
  ldd /usr/lib/libgloo.so.0
  echo "libgloo.so.0 => /usr/lib/libgloo.so.0"
} | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(\.venv|cuda)/|/lib(c|m|dl|rt|pthread|util|gcc_s|stdc\+\+)\.so' |
  while read -r lib; do cp -L "$lib" .gpu-carry/lib/; done
# Self-check: with only the pack and PyTorch's libraries on the search path, every library
# the binaries load resolves to one of those or to the C/C++ runtime that any Linux with
# Python has. A Debian library missed here would otherwise show up only on the GPU machine.
TORCH_LIB=$(.venv/bin/python -c 'import os, torch; print(os.path.dirname(torch.__file__))')/lib
NVIDIA_LIBS=$(ls -d "$(dirname "$(dirname "$TORCH_LIB")")"/nvidia/*/lib | paste -sd:)
# The Gloo module is loaded from memory at run time, so its libraries count as the binaries'.
stray=$(for b in .gpu-carry/bin/* .gpu-carry/lib/* "$BUILD_DIR/lib/libtdist_gloo_module.so"; do
          LD_LIBRARY_PATH=.gpu-carry/lib:$TORCH_LIB:$NVIDIA_LIBS ldd "$b"
        done | awk '$2 == "=>" {print $1, $3}' | sort -u |
        grep -v -E " ($PWD/\.gpu-carry/|\.gpu-carry/|$TORCH_LIB/|.*/nvidia/)" |
        grep -v -E '^(libc|libm|libdl|librt|libpthread|libutil|libgcc_s|libstdc\+\+)\.so|^linux-vdso' || true)
if [ -n "$stray" ]; then
  echo "gpu-pack: the binaries load libraries the pack does not carry:" >&2
  echo "$stray" >&2
  exit 1
fi
# What the binaries need of the C/C++ runtime there (gpu-check.sh compares).
for b in .gpu-carry/bin/* .gpu-carry/lib/*; do objdump -T "$b" 2>/dev/null; done |
  grep -o -E 'GLIBC_[0-9.]+|GLIBCXX_[0-9.]+' | sort -u -V |
  awk -F_ '{last[$1] = $0} END {print last["GLIBC"]; print last["GLIBCXX"]}' > .gpu-carry/requires.txt
cp tools/torch-version.txt .gpu-carry/
# A build of uncommitted changes says so.
git describe --always --dirty=+changes > .gpu-carry/commit.txt
du -sh .gpu-carry
ls .gpu-carry/bin .gpu-carry/lib
echo "needs at least: $(paste -sd' ' .gpu-carry/requires.txt)"
