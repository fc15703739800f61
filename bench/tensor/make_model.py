"""A random Llama folder for bench/tensor, made by transformers (save_pretrained).

  python make_model.py DIR
"""
import sys

import torch
import transformers

torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688,
                                  num_hidden_layers=4, num_attention_heads=8,
                                  num_key_value_heads=4, max_position_embeddings=512,
                                  tie_word_embeddings=False)
transformers.AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[1])
