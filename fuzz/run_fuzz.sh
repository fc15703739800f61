#!/usr/bin/env bash
# Builds one fuzzer with clang++ (libFuzzer + ASan + UBSan) and runs a short, bounded
# session. Used by ctest (fuzz/CMakeLists.txt) and by hand for longer runs:
#   fuzz/run_fuzz.sh <source dir> <work dir> <target> [libFuzzer flags, e.g. -max_total_time=600]
# Targets (readers of outside bytes; the last two link LibTorch from the .venv):
#   store_protocol  the TCP store's request parser
#   pickle          the pickle reader (DCP .metadata)
#   zip             the zip reader that checks torch.save archives
#   model_config    config.json as from_pretrained reads it (links LibTorch's c10 only)
#   safetensors     safetensors files: header validation and reads (links LibTorch's CPU library)
#   tokenizer       tokenizer.json: loading, then encoding and decoding with what loaded
#   dcp_metadata    DCP .metadata past the pickle layer (links LibTorch's CPU library)
#   launch_args     tdistrun's command line (arguments separated by NUL bytes)
#   train_config    the trainer's --config file (links LibTorch's c10 only)
# Seeds come from real files where a Python is at hand (the .venv's, or python3): pickles of
# Python's own pickler, DCP metadata and torch.save archives written by PyTorch,
# transformers' config.json of each family; else a few written here.
# Exit status: the fuzzer's (non-zero on a crash or a broken property). Prints SKIPPED and
# exits 0 only when no clang++ is installed.
set -euo pipefail
src=${1:?source dir}
work=${2:?work dir}
target=${3:?target: store_protocol, pickle, zip, model_config, safetensors, tokenizer, dcp_metadata, launch_args or train_config}
shift 3
clangxx=${CLANGXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [[ -z "$clangxx" ]]; then
  echo "SKIPPED: clang++ not found; install clang to run the $target fuzzer"
  exit 0
fi
python=${TDIST_TEST_PYTHON:-$src/.venv/bin/python}
[[ -x "$python" ]] || python=$(command -v python3 || true)
corpus="$work/corpus"
mkdir -p "$corpus"
bin="$work/${target}_fuzzer"
flags=(-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
       -I"$src/src" -I"$src/include")
# Per target: the sources beside the fuzzer, extra compiler flags, the LibTorch libraries it
# links (from the .venv's PyTorch), the longest input.
sources=("$src/src/util/error.cpp")
extra=()
torch_libs=()
system_libs=()
case "$target" in
  store_protocol)
    sources=("$src/src/store/tcp_store_protocol.cpp")
    printf '\x02\x0e\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00k\x01\x00\x00\x00\x00\x00\x00\x00v' \
      > "$corpus/seed_set"
    printf '\x08\x00\x00\x00\x00\x00\x00\x00\x00' > "$corpus/seed_num_keys"
    printf '\x0a\x0e\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00k\x01\x00\x00\x00\x00\x00\x00\x00v' \
      > "$corpus/seed_append"
    printf '\x0b\x16\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00a\x01\x00\x00\x00b\x64\x00\x00\x00\x00\x00\x00\x00' \
      > "$corpus/seed_multi_get"
    printf '\x0c\x1f\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00a\x01\x00\x00\x00\x00\x00\x00\x00x\x01\x00\x00\x00b\x00\x00\x00\x00\x00\x00\x00\x00' \
      > "$corpus/seed_multi_set"
    printf '\x0d\x0e\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00q\x01\x00\x00\x00\x00\x00\x00\x00v' \
      > "$corpus/seed_queue_push"
    printf '\x0e\x0d\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00q\xff\xff\xff\xff\xff\xff\xff\xff' \
      > "$corpus/seed_queue_pop"
    printf '\x0f\x05\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00q' \
      > "$corpus/seed_queue_len"
    printf 'GET / HTTP/1.1\r\n\r\n' > "$corpus/seed_http"
    max_len=4096
    ;;
  pickle)
    sources+=("$src/src/checkpoint/pickle_reader.cpp")
    max_len=65536
    ;;
  zip)
    sources+=("$src/src/checkpoint/zip_check.cpp" "$src/src/checkpoint/crc32c.cpp")
    extra=(-msse4.2 -mpclmul)
    max_len=65536
    ;;
  model_config)
    sources+=("$src/src/models/config.cpp")
    torch_libs=(-lc10)
    max_len=8192
    ;;
  safetensors)
    sources+=("$src/src/checkpoint/safetensors_file.cpp")
    torch_libs=(-ltorch_cpu -lc10)
    max_len=4096
    ;;
  tokenizer)
    sources+=("$src/src/models/tokenizer.cpp")
    extra=($(pkg-config --cflags-only-I libpcre2-8 sentencepiece 2>/dev/null || true))
    system_libs=(-lpcre2-8 -lsentencepiece -lutf8proc)
    max_len=131072
    ;;
  dcp_metadata)
    sources+=("$src/src/checkpoint/dcp_metadata.cpp" "$src/src/checkpoint/pickle_reader.cpp"
              "$src/src/checkpoint/pickle_writer.cpp" "$src/src/checkpoint/file_io.cpp"
              "$src/src/checkpoint/crc32c.cpp" "$src/src/checkpoint/torch_file.cpp"
              "$src/src/checkpoint/zip_crc_filler.cpp"
              "$src/src/checkpoint/extra_state.cpp" "$src/src/checkpoint/metadata_codec.cpp"
              "$src/src/util/torch_compat.cpp")
    extra=(-msse4.2 -mpclmul)
    torch_libs=(-ltorch_cpu -lc10)
    max_len=65536
    ;;
  launch_args)
    sources+=("$src/src/launch/launch_config.cpp" "$src/src/launch/numa_binding.cpp"
              "$src/src/launch/cpu_topology.cpp")
    max_len=2048
    ;;
  train_config)
    sources+=("$src/examples/gpt/cli.cpp" "$src/examples/gpt/config.cpp"
              "$src/examples/gpt/model_spec.cpp" "$src/examples/gpt/schedule.cpp"
              "$src/examples/gpt/sample_options.cpp" "$src/src/models/config.cpp")
    extra=(-I"$src/examples")
    torch_libs=(-lc10)
    max_len=8192
    ;;
  *)
    echo "unknown target '$target'" >&2
    exit 2
    ;;
esac
if [[ ${#torch_libs[@]} -gt 0 ]]; then
  torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)
  if [[ -z "$torch_dir" ]]; then
    echo "SKIPPED: no PyTorch at $python for LibTorch's headers; run tools/setup.sh"
    exit 0
  fi
  extra+=(-I"$torch_dir/include" -I"$torch_dir/include/torch/csrc/api/include")
  torch_libs=(-L"$torch_dir/lib" "${torch_libs[@]}" -Wl,-rpath,"$torch_dir/lib")
fi
# One object per source, through ccache where it is installed: the LibTorch-heavy sources
# take most of a run's time, and a clean build directory (CI's) then reuses them.
# Paths relative to the checkout and no working directory in the hash, so that another
# checkout or build directory hits the same entries.
launcher=$(command -v ccache || true)
export CCACHE_BASEDIR="$src" CCACHE_NOHASHDIR=1
objects=()
mkdir -p "$work/obj"
for source in "$src/fuzz/${target}_fuzzer.cpp" "${sources[@]}"; do
  object="$work/obj/${#objects[@]}-$(basename "${source%.cpp}").o"
  $launcher "$clangxx" "${flags[@]}" "${extra[@]}" -c "$source" -o "$object"
  objects+=("$object")
done
"$clangxx" "${flags[@]}" "${objects[@]}" "${torch_libs[@]}" "${system_libs[@]}" -o "$bin"
if [[ -n "$python" ]]; then
  "$python" "$src/fuzz/make_seeds.py" "$target" "$corpus"
fi
if [[ $# -eq 0 ]]; then set -- -runs=20000; fi
exec "$bin" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$work/" "$@" "$corpus"
