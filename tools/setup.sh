#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for tdist: installs every package from Debian's
# archive, then configures and builds the project (Release-with-debug-info, Ninja, ccache).
# Usage: tools/setup.sh [build-dir]        (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev            # LibTorch 1.13 (CPU): tensors, autograd, nn, optim
  libopenblas0-openmp     # LibTorch's BLAS is "generic": without OpenBLAS matmuls are ~12x slower
  libgloo-dev             # the Gloo collective engine we drive directly
  libopenmpi-dev openmpi-bin  # the MPI backend
  libssl-dev              # HMAC-SHA256 store authentication, checkpoint checksums
  nlohmann-json3-dev libfmt-dev libcli11-dev
  libgtest-dev libgmock-dev googletest
  python3-torch           # side-by-side benchmarks and checkpoint interchange tests
  clang                   # the store's libFuzzer target
  iproute2                # network-namespace tests of the multi-node launcher
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "== installing: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_BASEDIR="$PWD"
echo "== configuring $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== building (this takes a while on 2 cores: LibTorch headers are heavy)"
# Two compile jobs at most: each LibTorch translation unit needs ~1.5 GB of memory.
cmake --build "$BUILD_DIR" -j "$(( $(nproc) < 2 ? 1 : 2 ))"
