"""The TSV tables of the README and docs/tsv.md: held-out AUROC against baselines, seeds, bound sweeps.

``python -m steer_ui.tools.tsv_tables --data FILE [--seeds 0,1,2] [--bound-sweep 6,20]`` trains on the
embedded model (or ``--model``) and prints Markdown; ``--json`` keeps the full reports.  Report building
only: the runtime never imports this module.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Sequence

from ..data import load_dataset
from ..methods import tsv
from ..model.loading import load_model


def table_markdown(report: dict) -> str:
    """The held-out AUROC table (TSV vs baselines) and the Δlogit check, as Markdown."""
    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    runs = report["runs"]
    lines = ["| detector | held-out AUROC |", "|---|---|"]
    for key, run in runs.items():  # constrained, unconstrained, then any bound-sweep runs
        lines.append(f"| TSV ({key}) | {fmt(run['auroc'])} |")
    for name, b in report["baselines"].items():
        lines.append(f"| {name.replace('_', ' ')} | {fmt(b['auroc'])} |")
    lines += ["", "| run | max abs Δlogit (held-out, last position) | median per row | mean KL |", "|---|---|---|---|"]
    for key, r in runs.items():
        lines.append(f"| {key} | {fmt(r['max_abs_delta_logit'])} | {fmt(r['median_max_abs_delta_logit'])} | "
                     f"{fmt(r['mean_kl'])} |")
    return "\n".join(lines)


def _mean_sd(values) -> str:
    """``mean ± sd`` of the values that are not None (sd 0 for one value), or n/a."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def seeds_markdown(reports: Sequence[dict]) -> str:
    """Per-seed held-out AUROCs and max |Δlogit| with their mean ± standard deviation, as Markdown."""
    def cell(values):
        each = ", ".join(f"{v:.3f}" for v in values if v is not None)
        return _mean_sd(values), each or "n/a"

    rows = [("TSV (constrained)", [r["runs"].get("constrained", {}).get("auroc") for r in reports]),
            ("TSV (unconstrained)", [r["runs"].get("unconstrained", {}).get("auroc") for r in reports])]
    if all("constrained" in r["runs"] and "unconstrained" in r["runs"] for r in reports):
        drops = [r["runs"]["unconstrained"]["auroc"] - r["runs"]["constrained"]["auroc"] for r in reports]
        rows.append(("drop from the constraints", drops))
    for name in reports[0]["baselines"]:
        rows.append((name.replace("_", " "), [r["baselines"][name]["auroc"] for r in reports]))
    seeds = ", ".join(str(r["settings"]["seed"]) for r in reports)
    lines = [f"| detector | held-out AUROC, mean ± sd | per seed ({seeds}) |", "|---|---|---|"]
    lines += [f"| {name} | {' | '.join(cell(vals))} |" for name, vals in rows]
    lines += ["", f"| run | max abs Δlogit (held-out, last position), mean ± sd | per seed ({seeds}) |",
              "|---|---|---|"]
    for key in reports[0]["runs"]:
        lines.append(f"| {key} | {' | '.join(cell([r['runs'][key]['max_abs_delta_logit'] for r in reports]))} |")
    return "\n".join(lines)


def bounds_markdown(reports: Sequence[dict]) -> str:
    """The AUROC-against-bound table of ``bound_sweep`` runs (mean ± sd over the reports), as Markdown."""
    lines = ["| bound | held-out AUROC | held-out max abs Δlogit | mean KL |", "|---|---|---|---|"]
    for n, row in enumerate(reports[0].get("bound_sweep") or []):
        rows = [r["bound_sweep"][n] for r in reports]
        bound = "none" if row["bound"] is None else f"{row['bound']:g}"
        cells = [_mean_sd([x[key] for x in rows]) for key in ("auroc", "max_abs_delta_logit", "mean_kl")]
        lines.append(f"| {bound} | {' | '.join(cells)} |")
    return "\n".join(lines)


def parse_bounds(text: str | None) -> tuple[float, ...] | None:
    """``--bound-sweep 2,6,20`` → (2.0, 6.0, 20.0); a bad entry is a :class:`TSVError` naming it."""
    if not text:
        return None
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise tsv.TSVError(f"--bound-sweep takes comma-separated numbers like 2,6,20; "
                           f"{part.strip()!r} is not one") from None
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m steer_ui.tools.tsv_tables --data FILE``: train on the embedded model and print the AUROC table."""
    p = argparse.ArgumentParser(prog="python -m steer_ui.tools.tsv_tables", description=main.__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--max-rows", type=int, default=None, help="subsample whole groups (questions) to this many rows")
    p.add_argument("--layer", type=int, default=None)
    p.add_argument("--epochs", type=int, default=None, help="epochs of each stage (default 20)")
    p.add_argument("--exemplars", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds (e.g. 0,1,2): one run per seed (its own split, exemplars and "
                        "initialisation), reported as mean ± sd")
    p.add_argument("--max-logit-change", type=float, default=None, help="the |Δlogit| bound (default 2.0)")
    p.add_argument("--bound-sweep", default=None,
                   help="comma-separated extra |Δlogit| bounds (e.g. 6,20): one more constrained run per bound, "
                        "reported as AUROC against the bound")
    p.add_argument("--json", help="also write the full report here")
    args = p.parse_args(argv)
    dataset = load_dataset(args.data)
    handle = load_model(args.model)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    reports = []
    for seed in seeds:
        hp = {"seed": seed, "max_rows": args.max_rows, "exemplars": args.exemplars,
              "max_logit_change": args.max_logit_change, "bound_sweep": parse_bounds(args.bound_sweep)}
        if args.epochs is not None:
            hp["epochs"] = args.epochs
        start = time.perf_counter()
        _vector, report = tsv.train(handle, dataset, layer=args.layer,
                                    progress=lambda f, m: print(f"[{f:4.0%}] {m}", file=sys.stderr, flush=True),
                                    **{k: v for k, v in hp.items() if v is not None})
        report["seconds"] = round(time.perf_counter() - start, 1)
        reports.append(report)
        print(f"seed {seed}:\n" if len(seeds) > 1 else "", end="")
        print(table_markdown(report))
        print(f"\nrows {report['rows']}, layer {report['layer']}, λ = {report['lam']} × mean norm = "
              f"{report['lam_raw']:.1f}, pseudo-labels {report['pseudo_labels'].get('counts')}, "
              f"{report['seconds']} s\n", flush=True)
    if len(reports) > 1:
        print(seeds_markdown(reports))
    if reports[0]["bound_sweep"]:
        print("\n" + bounds_markdown(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports[0] if len(reports) == 1 else reports, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
