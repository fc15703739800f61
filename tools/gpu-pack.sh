#!/usr/bin/env bash
# Packs what tools/gpu-check.sh runs on the GPU machine into .gpu-carry/ (git-ignored): the
# GPU test binaries built here (stripped) and the Debian libraries they load that PyTorch's
# wheel does not bring. That machine has no network and none of tdist's build dependencies,
# but the same PyTorch (2.11.0+cu130) as tools/torch-version.txt, whose LibTorch the binaries
# were linked against. Then, on a task lent a GPU:
#   run(command="bash tools/gpu-check.sh", carry=[".gpu-carry"], timeout_s=480)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
SUITES=(tests/nccl/test_nccl tests/nccl/test_nccl_cuda tests/nccl/test_gloo_cuda)
cmake --build "$BUILD_DIR" -j2 --target test_nccl test_nccl_cuda test_gloo_cuda
rm -rf .gpu-carry
mkdir -p .gpu-carry/bin .gpu-carry/lib
for suite in "${SUITES[@]}"; do
  strip -o ".gpu-carry/bin/$(basename "$suite")" "$BUILD_DIR/$suite"
done
# Everything the binaries (and the Gloo module they load from memory, on libgloo) resolve
# outside LibTorch, NVIDIA's libraries and the C/C++ runtime.
{
  for suite in "${SUITES[@]}"; do ldd "$BUILD_DIR/$suite"; done
  ldd /usr/lib/libgloo.so.0
  echo "libgloo.so.0 => /usr/lib/libgloo.so.0"
} | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(\.venv|cuda)/|/lib(c|m|dl|rt|pthread|util|gcc_s|stdc\+\+)\.so' |
  while read -r lib; do cp -L "$lib" .gpu-carry/lib/; done
cp tools/torch-version.txt .gpu-carry/
du -sh .gpu-carry
ls .gpu-carry/lib
