"""One intra-op thread for L2S's many small CPU computations."""
from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def one_thread(device=None):
    """Run CPU work on one intra-op thread.

    The MLP's hundreds of tiny products and the small-batch forward passes
    here spend most of their time in threads spin-waiting for each other on
    a busy CPU: measured on the shared 2-core machine, one thread took 1/6 of
    the CPU time for a fit and 1/5 of the wall time for an activation pass.
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
