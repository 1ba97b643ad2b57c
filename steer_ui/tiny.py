"""Randomly initialised models built locally: tiny ones of each family, and real-shaped ones.

``tiny:FAMILY`` (``--model tiny:llama``): a few layers of width 64, for the
unit tests and instant demos.  ``random:SHAPE`` (``--model random:llama-8b``):
the exact shapes of a named real model with seeded random weights, built in
place on the target device, so speed figures for that size can be
reproduced without downloading weights.  Both use a byte-level tokenizer made
here (no download).
"""
from __future__ import annotations

import torch

from .messages import KeyedError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "gpt_neox", "phi3", "opt")
VOCAB = 260  # 256 bytes + <pad>, <s>, </s>, <unk>


def byte_tokenizer(vocab_size: int = VOCAB):
    """A byte-level tokenizer (one token per UTF-8 byte) with <s> prepended.

    ``vocab_size`` above :data:`VOCAB` pads the vocabulary with filler tokens
    (``<r260>``, ...) that text never encodes to, so every id a real-shaped
    random model can emit still decodes to something.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    for i in range(len(vocab), vocab_size):
        vocab[f"<r{i}>"] = i
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
    raise KeyedError.from_key("model_error_tiny_family", family=str(family)[:40], known=", ".join(FAMILIES))


def tiny_model(family: str = "llama", layers: int = 4, hidden: int = 64, seed: int = 0):
    """(model, tokenizer) for a random-initialised model of ``family``, in float32 eval mode."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(family, layers, hidden)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    return model, byte_tokenizer()


def tiny_handle(family: str = "llama", device: torch.device | str = "cpu", int8: bool = False, **kwargs):
    """A tiny model's handle; ``int8``: its weights rounded to int8 first (a tiny Gemma 3 so takes the fused C
    kernels, as the embedded model does)."""
    from .model.handle import from_model

    model, tok = tiny_model(family, **kwargs)
    if int8:
        from .model.int8 import quantise_model

        quantise_model(model)
    return from_model(model.to(device), tok, model_id=f"tiny:{family}")


# Real shapes for ``random:NAME``: (transformers config class, its arguments).  Llama 3 8B and Llama 3.2 1B as
# published (their rope scaling, which changes no shape or cost, left out); ``llama-mini`` is the same layout
# small enough for tests on a CPU.
SHAPES: dict[str, dict] = {
    "llama-8b": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                     max_position_embeddings=8192, rms_norm_eps=1e-5),
    "llama-1b": dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
                     max_position_embeddings=8192, rms_norm_eps=1e-5),
    "llama-mini": dict(num_hidden_layers=2, hidden_size=64, intermediate_size=224, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True, rope_theta=500000.0,
                       max_position_embeddings=512, rms_norm_eps=1e-5),
}


def random_config(shape: str):
    import transformers as tf

    if shape not in SHAPES:
        raise KeyedError.from_key("model_error_random_shape", shape=str(shape)[:40], known=", ".join(SHAPES))
    return tf.LlamaConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2, **SHAPES[shape])


def _empty_weights():
    """transformers' switch that skips its own weight initialisation (ours follows), where it has one."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: its initialisation runs and ours overwrites it
        from contextlib import nullcontext

        return nullcontext()
    return no_init_weights()


@torch.no_grad()
def _seeded_init(model: torch.nn.Module, seed: int, std: float) -> None:
    """Norm weights 1, every other parameter N(0, std²), drawn per parameter in float32 on its own device.

    Drawing in float32 and then rounding to the model's dtype means a
    bfloat16 build holds exactly the rounded weights of the float32 build of
    the same seed and device, so the two can be compared; only one
    parameter's float32 draw exists at a time.
    """
    generators: dict[torch.device, torch.Generator] = {}
    for name, p in model.named_parameters():  # a tied unembedding is listed (and drawn) once
        if p.ndim == 1:
            p.fill_(1.0 if "norm" in name else 0.0)
            continue
        gen = generators.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
        p.copy_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32).mul_(std))


def unfilled_model(shape: str, device: torch.device | str = "meta", dtype: torch.dtype = torch.float32):
    """A model of the named real ``shape`` whose parameters are allocated on ``device`` and not initialised.

    Built inside ``torch.device(device)``, so on a GPU no parameter passes
    through host memory (and on ``meta`` nothing is allocated at all).
    """
    from transformers import AutoModelForCausalLM

    with torch.device(device), _empty_weights():
        model = AutoModelForCausalLM.from_config(random_config(shape), dtype=dtype)
    model.tie_weights()  # skipping transformers' initialisation skips its tying too
    return model


def random_model(shape: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 seed: int = 0):
    """(model, tokenizer): a model of the named real ``shape`` with seeded random weights, built on ``device``."""
    model = unfilled_model(shape, device, dtype)
    _seeded_init(model, seed, model.config.initializer_range)
    model.eval()
    return model, byte_tokenizer(model.config.vocab_size)
