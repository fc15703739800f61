"""Trains the bundled tokenizer, data/tokenizer/, on the bundled corpus with Python `tokenizers`.

    .venv/bin/python tools/train_tokenizer.py            # rewrites data/tokenizer/

A byte-level BPE as Llama 3's and GPT-2's (GPT-2's pre-tokenizer regex, every byte in the
base vocabulary, so any text encodes), with Llama 3's special tokens: <|begin_of_text|>
(BOS, added in front of every encoded text by the post-processor) and <|end_of_text|> (EOS,
which the trainer puts between documents). The result is deterministic for a given corpus
and `tokenizers` version, and is checked in so that README command 1 needs no Python.
tokenizer_config.json names the special tokens as transformers' AutoTokenizer reads them.
"""
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    corpus = os.path.join(root, "data", "kjv.txt")
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "data", "tokenizer")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train([corpus], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tokenizer.token_to_id(BOS))])
    os.makedirs(out, exist_ok=True)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": 1024,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"wrote {out}/tokenizer.json ({tokenizer.get_vocab_size()} tokens) and tokenizer_config.json")


if __name__ == "__main__":
    main()
