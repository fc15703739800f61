#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for tdist: installs the Debian packages, installs the
# pinned PyTorch (tools/torch-version.txt) from PyPI into .venv/ (its LibTorch is what tdist
# builds on; its Python runs the side-by-side benchmarks and interchange tests), then
# configures and builds the project (Release-with-debug-info, Ninja, ccache).
# Re-running it downloads nothing and rebuilds only what changed.
# Usage: tools/setup.sh [build-dir] [targets...|all]
#   default: build/, and only what tools/quickstart.sh runs (the libraries, tdistrun, gpt);
#   `all` builds every target (tests, benchmarks, fuzzers), as tools/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true
QUICKSTART_TARGETS=(tdistrun gpt)
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${QUICKSTART_TARGETS[@]}")
[ "${TARGETS[*]}" = all ] && TARGETS=()
TORCH_PIN=$(tr -d '[:space:]' < tools/torch-version.txt)

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  python3 python3-venv    # the project-local .venv/ with PyTorch from PyPI
  libgloo-dev             # Debian's Gloo, which tdist's Gloo transport module is built on (docs/gloo.md)
  libopenmpi-dev openmpi-bin  # the MPI backend
  mpich                   # MPICH's Hydra mpiexec, a launcher tests start jobs with (not linked)
  slurmctld slurmd slurm-client  # a private single-node SLURM that test_slurm starts (srun -n 3)
  libssl-dev              # HMAC-SHA256 store authentication, checkpoint checksums
  nlohmann-json3-dev libcli11-dev
  libpcre2-dev            # Unicode regexes of the tokenizers' pre-tokenizers
  libsentencepiece-dev    # SentencePiece tokenizer.model (Llama 2, Mistral)
  libutf8proc-dev         # Unicode NFC, the normalizer of Qwen2's tokenizer.json
  libgtest-dev libgmock-dev googletest
  clang                   # the store's libFuzzer target
  iproute2 util-linux     # network- and UTS-namespace tests (ip netns, unshare)
  nftables                # a namespace host cut off by dropping its packets (heartbeat test)
)

# Disk: a full build (every target, with compressed debug info) takes ~7 GiB and the PyTorch
# wheel ~5 GiB; running out half-way fails at some link step with a bare "No space left on device".
need_gib=8
[ -x .venv/bin/python ] || need_gib=$((need_gib + 5))
have_gib=$(( $(df -Pk . | awk 'NR==2 {print $4}') / 1024 / 1024 ))
built_gib=0
[ -d "$BUILD_DIR" ] && built_gib=$(( $(du -sk "$BUILD_DIR" | cut -f1) / 1024 / 1024 ))
if [ "${TDIST_SKIP_DISK_CHECK:-0}" != 1 ] && (( have_gib + built_gib < need_gib )); then
  echo "error: $have_gib GiB free on $(df -P . | awk 'NR==2 {print $6}'), and a build of tdist needs" \
       "~$need_gib GiB (build/ ~7 GiB${built_gib:+, $built_gib GiB of it already in $BUILD_DIR}," \
       "PyTorch ~5 GiB if not installed yet). Free some space (old build folders, /tmp), or set" \
       "TDIST_SKIP_DISK_CHECK=1 to try anyway." >&2
  exit 1
fi

# PyTorch from PyPI into .venv/ (once; ~5 GB with its CUDA libraries, which it loads even on
# machines without a GPU).
# safetensors: the Python side of the export tests (pt / safetensors files of `gpt export`).
# transformers, tokenizers, sentencepiece: the oracles of the model families' parity tests
# (tests/models), which make small random models and compare logits and files.
PY_PACKAGES=("torch==$TORCH_PIN" numpy safetensors $(grep -v '^#' tools/python-requirements.txt))
install_python_env() {
  echo "== installing PyTorch $TORCH_PIN and the test oracles into .venv/"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
}
python_env_ready() { .venv/bin/python tools/check-python-env.py "$TORCH_PIN" 2>/dev/null; }

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
apt_install() {
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "$@"
}
# The PyTorch download overlaps the Debian packages: python3 and its venv module go first, then
# pip runs in the background while apt installs the rest (both mostly wait on the network).
pip_pid=""
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  $SUDO apt-get update -q
  apt_install python3 python3-venv
fi
if ! python_env_ready; then
  install_python_env &
  pip_pid=$!
fi
if ((${#missing[@]})); then
  apt_install "${missing[@]}"
fi
if [ -n "$pip_pid" ] && ! wait "$pip_pid"; then
  echo "error: installing PyTorch $TORCH_PIN into .venv/ failed (pip's messages above); PyPI" \
       "must be reachable. Re-run tools/setup.sh to retry." >&2
  exit 1
fi

export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_BASEDIR="$PWD"
# Clones in other folders (CI) share the cache: paths are relative to the clone, and the
# working directory stays out of the hash (it only names the debug info's compile dir).
export CCACHE_NOHASHDIR=1
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  echo "== configuring $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
echo "== building ${TARGETS[*]:-every target} (a while on 2 cores the first time: LibTorch headers are heavy)"
# Two compile jobs at most: each LibTorch translation unit needs ~1.5 GB of memory.
cmake --build "$BUILD_DIR" -j "$(( $(nproc) < 2 ? 1 : 2 ))" ${TARGETS[@]:+--target "${TARGETS[@]}"}
