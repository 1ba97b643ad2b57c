"""Runs after every hostile-client module (pytest collects files in name order): the sampler has watched every
attack, flood and honest session of the suite on the one server."""
from __future__ import annotations

import math

from hostile_kit import MEMORY_CAP


def test_peak_memory_over_the_suite_stays_under_the_cap(server):
    """The app's peak resident memory over the whole suite stays under the cap."""
    assert server.peak_rss > 0
    assert server.peak_rss < MEMORY_CAP, f"peak RSS {server.peak_rss / 2**30:.2f} GB"
    print(f"\npeak RSS of the app over the hostile-client suite: {server.peak_rss / 2**30:.2f} GB")
    assert not math.isnan(server.peak_rss)
