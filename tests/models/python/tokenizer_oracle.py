"""The Python `tokenizers` / `sentencepiece` side of tdist's tokenizer tests: byte-level BPE
tokenizers trained here on the bundled corpus, in GPT-2's, Llama 3's and Qwen2's
pre-tokenization (Qwen2's with its NFC normalizer), a SentencePiece BPE model with byte
fallback (as Llama 2's), and what the libraries make of a Unicode stress text and of the corpus.

  make DIR CORPUS   writes DIR/<kind>.json (tokenizer.json) for each kind,
                    DIR/sentencepiece.model, and
                    DIR/expected.json: {kind: [{"text", "ids", "ids_plain", "decoded"}]}
Prints "OK make".
"""
import json
import os
import sys

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

STRESS = [
    "Hello, world! It's 2026; they'll say we'd've DONE it.",
    "日本語のテキストと中文字符，还有한국어。",
    "Emoji: 👩‍👩‍👧‍👦 family, 👍🏽 thumbs, 🇫🇷 flag, ❤️ heart.",
    "Combining: e\u0301 a\u0308 n\u0303 — and precomposed: é ä ñ.",
    "Spaces:   three,\t\ttabs,\n\n\nnewlines, \r\n CRLF,    trailing   ",
    "Digits 1234567890 and 3.14159, 1e-5, 0x1F.",
    "Special tokens in text: <|endoftext|> and <|begin_of_text|>hi<|eot_id|> then <extra> x",
    "   leading spaces and a lone \u200d joiner",
    "",
]


def train(kind, corpus, vocab_size=1500):
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<|endoftext|>"]
    else:
        tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if kind == "llama3" else QWEN2), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = (["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] if kind == "llama3"
                    else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()  # as Qwen2's tokenizer.json has it
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    if kind == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        from tokenizers import AddedToken
        tok.add_tokens([AddedToken("<extra>", lstrip=True, rstrip=True)])
    return tok


def sentencepiece_rows(out, corpus, sample):
    """A BPE tokenizer.model with byte fallback, as Llama 2's and Mistral's are."""
    import io
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model,
                                   vocab_size=1000, model_type="bpe", byte_fallback=True,
                                   character_coverage=0.9995, num_threads=1,
                                   minloglevel=2)
    path = os.path.join(out, "sentencepiece.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=path)
    rows = []
    for t in sample:
        plain = sp.encode(t)
        ids = [sp.bos_id()] + plain
        rows.append({"text": t, "ids": ids, "ids_plain": plain, "decoded": sp.decode(ids),
                     "decoded_skip": sp.decode(plain)})
    return rows


def main():
    command, out, corpus_path = sys.argv[1], sys.argv[2], sys.argv[3]
    assert command == "make"
    os.makedirs(out, exist_ok=True)
    text = open(corpus_path, encoding="utf-8").read()
    corpus = [text[i:i + 2000] for i in range(0, 300000, 2000)] + STRESS * 3
    sample = [text[:20000]] + STRESS
    expected = {}
    for kind in ("gpt2", "llama3", "qwen2"):
        tok = train(kind, corpus)
        tok.save(os.path.join(out, kind + ".json"))
        rows = []
        for t in sample:
            ids = tok.encode(t).ids
            rows.append({"text": t, "ids": ids, "ids_plain": tok.encode(t, add_special_tokens=False).ids,
                         "decoded": tok.decode(ids, skip_special_tokens=False),
                         "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        expected[kind] = rows
    expected["sentencepiece"] = sentencepiece_rows(out, corpus, sample)
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)
    print("OK make")


if __name__ == "__main__":
    main()
