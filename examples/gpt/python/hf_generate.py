"""Greedy continuation of a prompt by transformers, from what `gpt export` writes.

    .venv/bin/python examples/gpt/python/hf_generate.py runs/quickstart/hf --prompt "And God said"

PATH is a Hugging Face model folder (`gpt export --format hf`, the default), or a weights
file of the other formats (.pt, .safetensors, or a .dcp directory) with its config.json
beside it (same name, .json) and the tokenizer folder given by --tokenizer. Prints the
prompt and the new text (special tokens left out), as `gpt generate --temperature 0` does.
"""
import argparse
import json
import os
import sys

import torch
import transformers

transformers.utils.logging.disable_progress_bar()


def load(path, tokenizer_dir):
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model, transformers.AutoTokenizer.from_pretrained(tokenizer_dir or path)
    with open(os.path.splitext(path)[0] + ".json") as f:
        fields = json.load(f)
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        state = load_file(path)
    elif path.endswith(".pt"):
        state = torch.load(path, weights_only=True)
    else:  # a torch.distributed.checkpoint directory: {"model": state_dict}
        import torch.distributed.checkpoint as dcp
        state = {"model." + k: v for k, v in model.state_dict().items() if k not in tied}
        dcp.load(state, checkpoint_id=path)
        state = {k[len("model."):]: v for k, v in state.items()}
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()},
                                                strict=False)
    if set(missing) - tied or unexpected:
        raise SystemExit(f"{path}: missing {sorted(set(missing) - tied)}, unexpected {unexpected}")
    model.tie_weights()
    return model, transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--prompt", default="And God said")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (other formats)")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.path, args.tokenizer)
    model.eval()
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=args.max_new_tokens,
                             pad_token_id=model.config.eos_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    sys.stdout.write(args.prompt + text + "\n")


if __name__ == "__main__":
    main()
