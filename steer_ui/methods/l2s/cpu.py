"""One intra-op thread for the L2S MLP's many small CPU products."""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def one_thread(device=None):
    """Run CPU work on one intra-op thread.

    The MLP's hundreds of tiny products spend most of their time in threads
    waiting for each other: measured on the shared 2-core machine, one thread
    took 1/6 of the CPU time for a fit.  The model's forward passes (context
    activations, evaluation) used to run on one thread too, for the same
    reason, but that waiting was the OpenMP runtime's throttling while idle
    helper threads outnumbered the CPUs (``steer_ui.model.cpu_threads``);
    without it they run on every thread: the bench's L2S training on the
    embedded model took 46-48 s with them on one thread, 29-30 s with the fit
    alone on one (31 s in a third pair, this code), 27-31 s with nothing on one (two
    runs each, twice).
    The setting is process-wide, so it is restored on exit; GPU work is left
    alone.
    """
    if device is not None and torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
