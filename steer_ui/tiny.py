"""Tiny randomly initialised models of each supported family, built locally.

Used by the unit tests and for instant demos (``--model tiny:llama``): no
download, a byte-level tokenizer made here, a few layers of width 64.
"""
from __future__ import annotations

import torch

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "gpt_neox", "phi3", "opt")
VOCAB = 260  # 256 bytes + <pad>, <s>, </s>, <unk>


def byte_tokenizer():
    """A byte-level tokenizer (one token per UTF-8 byte) with <s> prepended."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.padding_side = "left"
    return fast


def tiny_config(family: str, layers: int = 4, hidden: int = 64):
    import transformers as tf

    common = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    llama_like = dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **common)
    if family == "llama":
        return tf.LlamaConfig(**llama_like)
    if family == "mistral":
        return tf.MistralConfig(sliding_window=None, **llama_like)
    if family == "qwen2":
        return tf.Qwen2Config(**llama_like)
    if family == "qwen3":
        return tf.Qwen3Config(head_dim=16, **llama_like)
    if family == "gemma":
        return tf.GemmaConfig(head_dim=16, **llama_like)
    if family == "gemma2":
        return tf.Gemma2Config(head_dim=16, sliding_window=16, final_logit_softcapping=30.0, **llama_like)
    if family == "gemma3":
        return tf.Gemma3TextConfig(head_dim=16, sliding_window=16, **llama_like)
    if family == "phi3":
        return tf.Phi3Config(**llama_like)
    if family == "gpt2":
        return tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, **common)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                                num_attention_heads=4, max_position_embeddings=256, **common)
    if family == "opt":
        return tf.OPTConfig(hidden_size=hidden, ffn_dim=hidden * 2, num_hidden_layers=layers, num_attention_heads=4,
                            max_position_embeddings=256, word_embed_proj_dim=hidden, **common)
    raise ValueError(f"unknown tiny family '{family}' (choose from {', '.join(FAMILIES)})")


def tiny_model(family: str = "llama", layers: int = 4, hidden: int = 64, seed: int = 0):
    """(model, tokenizer) for a random-initialised model of ``family``, in float32 eval mode."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family, layers, hidden)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    return model, byte_tokenizer()


def tiny_handle(family: str = "llama", **kwargs):
    from .model.loading import from_model

    model, tok = tiny_model(family, **kwargs)
    return from_model(model, tok, model_id=f"tiny:{family}")
