"""What one Explore chart costs the server to build and the page to receive, with the app's template and with
plotly's full ``plotly_white`` (the template the charts used before).

    python -m steer_ui.tools.chart_cost [--repeats 50]

Builds the next-token bars (two top-10 lists, as a slider move draws them) through :func:`plots._layout` and
prints the median build-and-serialise time and the JSON size for each template.  One process, one run: compare
the two rows, not times from another run.
"""
from __future__ import annotations

import argparse
from unittest import mock

import pandas as pd
import torch

from .. import plots
from .timing import median, ms, timings

TOKENS = [f"token{i}" for i in range(10)]


def _frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    probs = [0.3 / (i + 1) for i in range(10)]
    unsteered = pd.DataFrame({"token": TOKENS, "token_id": list(range(10)), "prob": probs})
    steered = pd.DataFrame({"token": TOKENS[::-1], "token_id": list(range(10))[::-1], "prob": probs})
    return unsteered, steered


def measure(repeats: int) -> list[tuple[str, float, int]]:
    """(template, median ms to build and serialise the bars, JSON bytes) for the app's and plotly_white."""
    unsteered, steered = _frames()

    def build() -> str:
        return plots.next_token_bars(unsteered, steered).to_json()

    rows = []
    for name, template in (("app (plots.TEMPLATE)", plots.TEMPLATE), ("plotly_white", "plotly_white")):
        with mock.patch.object(plots, "TEMPLATE", template):
            size = len(build())  # also the first call's warm-up
            rows.append((name, ms(median(timings(build, repeats, torch.device("cpu")))), size))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    for name, took, size in measure(args.repeats):
        print(f"{name:22s} {took:7.2f} ms  {size:6d} bytes of JSON")


if __name__ == "__main__":
    main()
