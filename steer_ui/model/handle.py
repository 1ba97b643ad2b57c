"""The loaded model every session shares (:class:`ModelHandle`), and wrapping an already-built model in one.

Apart from :mod:`.loading` so that modules which build models themselves
(:mod:`steer_ui.tiny`) can make a handle without importing the loader, which
imports them.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from . import fused_ops
from .architecture import Architecture, discover, fast_cpu_linears
from .int8 import int8_weights


@dataclass
class ModelHandle:
    """A loaded model plus everything steering needs, shared by all sessions.

    Forward passes need no lock: every hook acts only in the thread that
    installed it (:func:`steer_ui.model.capture.thread_owned`), so the decode
    engine, the slider and a training job can share the model at once without
    seeing each other's steering.  ``lock`` serialises the long jobs
    (training, extraction, probing) among themselves, which bounds their
    memory; generation and the slider never wait for it.
    """

    model: torch.nn.Module
    tokenizer: object
    arch: Architecture
    model_id: str
    source: str
    device: torch.device
    dtype: torch.dtype
    lock: threading.RLock = field(default_factory=threading.RLock)
    load_seconds: float = 0.0
    weights: str = "float32"  # float32, bfloat16 or int8 (steer_ui.model.precision)
    precision_cost: dict | None = None  # int8's measured cost against float32 (precision.cost), where measured
    int8_exact: bool = False  # int8 on the model's own codes (a GGUF's), not rounded from floats
    fused: dict = field(default_factory=dict)  # norms, rotary and product groups fused at load (fused_ops)
    _layer_norms: list[float] | None = None

    @property
    def model_type(self) -> str:
        return self.arch.model_type

    @property
    def input_device(self) -> torch.device:
        emb = self.model.get_input_embeddings()
        int8 = getattr(emb, "int8", None)
        return int8.device if int8 is not None else emb.weight.device

    def parameter_count(self) -> int:
        """Unique parameters (a tied lm_head counts once), int8 weights' codes included."""
        count = sum(p.numel() for p in self.model.parameters())
        return int(count + sum(w.codes.numel() for w in int8_weights(self.model)))

    def facts(self) -> dict:
        n_params = self.parameter_count()
        return {
            "model_id": self.model_id,
            "model_type": self.arch.model_type,
            "num_layers": self.arch.num_layers,
            "hidden_size": self.arch.hidden_size,
            "vocab_size": self.arch.vocab_size,
            "tied_lm_head": self.arch.tied_lm_head,
            "parameters": int(n_params),
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "load_seconds": round(self.load_seconds, 2),
            "weights": self.weights,
            "int8_exact": self.int8_exact,
            "precision_cost": self.precision_cost,
        }

    def layer_norms(self) -> list[float]:
        """Mean residual-stream norm at each block output, measured once (see :mod:`.units`)."""
        if self._layer_norms is None:
            from .units import measure_layer_norms

            self._layer_norms = measure_layer_norms(self)
        return self._layer_norms


def from_model(model: torch.nn.Module, tokenizer, model_id: str = "in-memory", source: str | None = None,
               device: torch.device | None = None, dtype: torch.dtype | None = None,
               load_seconds: float = 0.0) -> ModelHandle:
    """Wrap an already-built model (frozen, eval mode; the tokenizer pads on the left).

    ``device`` and ``dtype`` default to those of the first parameter.
    """
    model.eval()
    model.requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    p = next(model.parameters())
    arch = discover(model)
    if p.device.type == "cpu" and p.dtype == torch.float32:
        fast_cpu_linears(model, arch.layers)  # few-row products (decode steps, slider) through oneDNN where faster
    fused = fused_ops.install(model)  # fewer kernels a block (bit for bit; on CUDA up to rounding)
    return ModelHandle(model=model, tokenizer=tokenizer, arch=arch, model_id=model_id,
                       source=source or model_id, device=device or p.device, dtype=dtype or p.dtype,
                       load_seconds=load_seconds, fused=fused)
