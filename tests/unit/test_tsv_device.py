"""Every tensor TSV makes follows the model's device (issue #20: `--device cuda` crashed at `weights.T @ reps`).

No GPU here, so the test makes the mistake visible on a CPU: while TSV trains and scores, a tensor that
TSV's own code (steer_ui/methods/tsv/, constraints.py) creates without naming a device is put on the
``meta`` device instead of the default, and listed.  On a CUDA model such a tensor would land on the CPU and
meet a CUDA tensor; here the list must stay empty (and a meta tensor that reached a number would fail to copy
out).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import steer_ui.methods.constraints as constraints_module
from steer_ui.methods import tsv

from test_tsv import _rows

FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.randn, torch.rand, torch.randint, torch.arange,
             torch.eye, torch.linspace, torch.tensor, torch.as_tensor}
TSV_DIR = Path(tsv.__file__).parent
WATCHED = (str(TSV_DIR), constraints_module.__file__)


class DefaultDeviceIsElsewhere(TorchFunctionMode):
    """Send factory calls from TSV's code that name no device to ``meta``; count them."""

    def __init__(self):
        super().__init__()
        self.redirected: list[str] = []
        self.seen = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        caller = sys._getframe(1)
        if func in FACTORIES and caller.f_code.co_filename.startswith(WATCHED):
            self.seen += 1
            # torch.tensor(t) / as_tensor(t) of a tensor keep t's device: not a default-device tensor
            from_data = func in (torch.tensor, torch.as_tensor) and args and isinstance(args[0], torch.Tensor)
            if "device" not in kwargs and not from_data:
                kwargs["device"] = "meta"
                self.redirected.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} {func.__name__}")
        return func(*args, **kwargs)


def test_the_mode_catches_a_tensor_made_on_the_default_device():
    """The check itself: code in TSV's files that makes a tensor without a device is caught; other code is not."""
    # the line that crashed on CUDA, as if written in maths.py: labels made on the default device
    namespace = {"torch": torch}
    exec(compile("def labels():\n    return torch.zeros(4, 2)\n", str(TSV_DIR / "maths.py"), "exec"), namespace)
    with DefaultDeviceIsElsewhere() as mode:
        made_here = torch.zeros(4, 2)  # this file is not TSV's code: untouched
        caught = namespace["labels"]()
        empty = tsv.select_confident(torch.full((1, 2), 0.5), torch.zeros(1, 2), k=0, class_dist=[0.5, 0.5])
    assert made_here.device.type == "cpu" and empty.device.type == "cpu"  # select_confident names its device
    assert caught.device.type == "meta" and mode.redirected == ["maths.py:2 zeros"]


@pytest.mark.parametrize("penalty_positions", ["answer", "last"])
def test_tsv_trains_and_scores_with_every_tensor_on_the_models_device(tiny, penalty_positions):
    h = tiny("llama")
    mode = DefaultDeviceIsElsewhere()
    with mode:
        vector, report = tsv.train(h, _rows(10), layer=1, init_epochs=1, aug_epochs=1, exemplars=6, selected=4,
                                   penalty_positions=penalty_positions, prototype_init="random")
        scores = tsv.score(h, vector, [("What colour is thing 1?", "It is red 1")])
    assert mode.redirected == [], mode.redirected
    assert mode.seen > 0  # the mode saw TSV's own factory calls (so it was in force)
    assert 0.0 <= scores[0] <= 1.0 and 0.0 <= report["auroc"] <= 1.0
    assert vector.extras["prototypes"].device == vector.direction().device == torch.device("cpu")
