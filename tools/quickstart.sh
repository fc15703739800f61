#!/usr/bin/env bash
# README command 1, second half: pretrains the default model (a small Llama with grouped-query
# attention, examples/gpt) on the bundled corpus with the bundled BPE tokenizer, FSDP over 2
# local ranks started by tdistrun; prints a generated sample; exports the run as a Hugging
# Face model folder (runs/quickstart/hf); and, where .venv/ has transformers, checks that
# transformers' greedy continuation of a prompt equals `gpt generate --temperature 0`'s.
# Extra arguments go to the trainer (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
TDISTRUN="$BUILD_DIR/tools/tdistrun/tdistrun"
GPT="$BUILD_DIR/examples/gpt/gpt"
PYTHON=${TDIST_PYTHON:-.venv/bin/python}
for exe in "$TDISTRUN" "$GPT"; do
  [ -x "$exe" ] || { echo "quickstart: $exe is missing; run tools/setup.sh first" >&2; exit 1; }
done

# The run dir the trainer will use: --run-dir, else runs/<--name>.
run_dir=runs/quickstart
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --run-dir) run_dir=${args[i + 1]:-$run_dir} ;;
    --run-dir=*) run_dir=${args[i]#--run-dir=} ;;
    --name) run_dir=runs/${args[i + 1]:-quickstart} ;;
    --name=*) run_dir=runs/${args[i]#--name=} ;;
  esac
done

"$TDISTRUN" --standalone --nproc-per-node 2 "$GPT" --name quickstart --n-kv-head 2 "$@"

echo "== exporting $run_dir as a Hugging Face model folder"
"$GPT" export --run-dir "$run_dir" --out "$run_dir/hf"

if ! "$PYTHON" -c 'import transformers' >/dev/null 2>&1; then
  echo "== skipping the transformers check: $PYTHON has no transformers (tools/setup.sh installs it)"
  exit 0
fi
echo "== transformers loads $run_dir/hf and continues a prompt greedily; tdist does the same"
prompt="And God said"
ours=$("$GPT" generate --run-dir "$run_dir" --prompt "$prompt" --temperature 0 \
  --max-new-tokens 40 --threads 1)
theirs=$("$PYTHON" examples/gpt/python/hf_generate.py "$run_dir/hf" --prompt "$prompt" \
  --max-new-tokens 40 --threads 1)
echo "tdist:        $ours"
echo "transformers: $theirs"
if [ "$ours" = "$theirs" ]; then
  echo "== the same text, token for token"
else
  echo "quickstart: transformers' greedy continuation differs from tdist's" >&2
  exit 1
fi
