"""The TSV tables of docs/tsv.md: held-out AUROC against like-for-like baselines, seeds, the Δlogit check.

``python -m steer_ui.tools.tsv_tables --data FILE [--seeds 0,1,2] [--bound-sweep 6,20]`` trains on the
embedded model (or ``--model``) and prints Markdown; ``--json`` keeps the full reports.  On TruthfulQA the
model answers the questions first (answers cached under ``steer_ui.paths.cache_root()/tsv_answers``).
Report building only: the runtime never imports this module.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..data import load_dataset
from ..methods import tsv
from ..model.loading import load_model
from ..paths import cache_root


BASELINE_NAMES = {
    "probe_exemplars": "exemplar probe (TSV's labels)",
    "mean_difference_exemplars": "exemplar mean difference (TSV's labels)",
    "probe": "full-label probe (ceiling)",
    "probe_at_block": "full-label probe at the steered block",
    "mean_token_logprob": "mean token log-probability (no training)",
    "perplexity": "perplexity (no training)",
    "prototypes_without_vector": "prototypes without vector (v = 0)",
}


def _name(key: str) -> str:
    return BASELINE_NAMES.get(key, key.replace("_", " "))


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def table_markdown(report: dict) -> str:
    """The held-out AUROC table (TSV vs baselines) and the Δlogit check of one report, as Markdown."""
    runs = report["runs"]
    lines = ["| detector | held-out AUROC |", "|---|---|"]
    for key, run in runs.items():  # constrained, unconstrained, then any bound-sweep runs
        lines.append(f"| TSV ({key}) | {_fmt(run['auroc'])} |")
    for name, b in report["baselines"].items():
        lines.append(f"| {_name(name)} | {_fmt(b['auroc'])} |")
    lines += ["", "| run | steering scale | max abs centred Δlogit, generation positions, steering strength | raw | "
                  "last position (centred) | mean KL | centred, detector strength |",
              "|---|---|---|---|---|---|---|"]
    for key, r in runs.items():
        last = r.get("last_position", {})
        lines.append(f"| {key} | {_fmt(r.get('steering_scale'))} | {_fmt(r['max_abs_delta_logit'])} | "
                     f"{_fmt(r.get('max_abs_raw_delta_logit'))} | {_fmt(last.get('max_abs_delta_logit'))} | "
                     f"{_fmt(r['mean_kl'])} | {_fmt(r.get('detector_strength', {}).get('max_abs_delta_logit'))} |")
    check = runs.get("constrained", {}).get("bound_check")
    if check:
        lines += ["", bound_check_line(check)]
    return "\n".join(lines)


def bound_check_line(check: dict) -> str:
    """The constrained run's bound check: its note, then each worst row at its worst position."""
    worst = "; ".join(f"{w['max_abs_delta_logit']:.2f} at answer token {w['answer_token']} ({w['token']!r}) of "
                      f"{w['answer']!r}" for w in check["worst_rows"])
    return f"{check['note']} Worst rows: {worst}."


def _mean_sd(values) -> str:
    """``mean ± sd`` of the values that are not None (sd 0 for one value), or n/a."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def seeds_markdown(reports: Sequence[dict]) -> str:
    """Per-seed held-out AUROCs and max |Δlogit| with their mean ± standard deviation, and the target's verdict."""
    def cell(values):
        each = ", ".join(f"{v:.3f}" for v in values if v is not None)
        return _mean_sd(values), each or "n/a"

    def run_values(key, field):
        return [r["runs"].get(key, {}).get(field) for r in reports]

    rows = [("TSV (constrained)", run_values("constrained", "auroc")),
            ("TSV (unconstrained)", run_values("unconstrained", "auroc"))]
    both = all("constrained" in r["runs"] and "unconstrained" in r["runs"] for r in reports)
    if both:
        drops = [r["runs"]["unconstrained"]["auroc"] - r["runs"]["constrained"]["auroc"] for r in reports]
        rows.append(("drop from the constraints", drops))
    for name in reports[0]["baselines"]:
        rows.append((_name(name), [r["baselines"][name]["auroc"] for r in reports]))
    seeds = ", ".join(str(r["settings"]["seed"]) for r in reports)
    lines = [f"| detector | held-out AUROC, mean ± sd | per seed ({seeds}) |", "|---|---|---|"]
    lines += [f"| {name} | {' | '.join(cell(vals))} |" for name, vals in rows]
    bound = reports[0]["settings"]["max_logit_change"]
    lines += ["", f"| run | steering scale | max abs Δlogit at generation positions, centred, steering strength "
                  f"(bound {bound:g}) | raw | at the last position, centred | per seed, centred ({seeds}) | "
                  f"centred, detector strength |", "|---|---|---|---|---|---|---|"]
    for key in reports[0]["runs"]:
        centred = run_values(key, "max_abs_delta_logit")
        raw = run_values(key, "max_abs_raw_delta_logit")
        last = [r["runs"][key].get("last_position", {}).get("max_abs_delta_logit") for r in reports]
        detector = [r["runs"][key].get("detector_strength", {}).get("max_abs_delta_logit") for r in reports]
        lines.append(f"| {key} | {_mean_sd(run_values(key, 'steering_scale'))} | {_mean_sd(centred)} | "
                     f"{_mean_sd(raw)} | {_mean_sd(last)} | {cell(centred)[1]} | {_mean_sd(detector)} |")
    checks = [r["runs"].get("constrained", {}).get("bound_check") for r in reports]
    if all(checks):
        per_seed = ", ".join(f"{c['rows_over']} of {c['rows']} rows ({c['positions_over']} of {c['positions']} "
                             f"positions)" for c in checks)
        lines += ["", f"Held-out rows where the constrained run broke the bound, per seed ({seeds}): {per_seed}."]
        if all("with_limit" in c for c in checks):
            lines += ["", with_limit_line(checks)]
    if both:
        lines += ["", verdict(reports)]
    return "\n".join(lines)


def with_limit_line(checks: Sequence[dict]) -> str:
    """The constrained vector steered as steer_ui steers it, with the Δlogit limit the saved vector carries."""
    limited = sum(c["with_limit"]["positions_limited"] for c in checks)
    positions = sum(c["positions"] for c in checks)
    worst = max(c["with_limit"]["max_abs_delta_logit"] for c in checks)
    line = (f"Steered with the Δlogit limit the saved vector carries (generation's default): max centred |Δlogit| "
            f"{worst:.3f} over the seeds' held-out generation positions (bound {checks[0]['limit']:g}); the limit "
            f"scales {limited} of {positions} positions")
    if limited:
        line += f", keeping at least {min(c['with_limit']['least_kept'] for c in checks):.2f} of their change"
    return line + "."


def verdict(reports: Sequence[dict]) -> str:
    """The issue's target, checked on the means: constrained within 0.02 of unconstrained, above the exemplar
    probe, and every seed's constrained max |Δlogit| (centred, generation positions) within the bound."""
    con = _mean([r["runs"]["constrained"]["auroc"] for r in reports])
    free = _mean([r["runs"]["unconstrained"]["auroc"] for r in reports])
    probe = _mean([r["baselines"]["probe_exemplars"]["auroc"] for r in reports])
    bound = reports[0]["settings"]["max_logit_change"]
    worst = max(r["runs"]["constrained"]["max_abs_delta_logit"] for r in reports)
    checks = [(free - con <= 0.02, f"constrained {con:.3f} vs unconstrained {free:.3f} (drop {free - con:+.3f}, "
                                   f"target ≤ 0.02)"),
              (con > probe, f"constrained {con:.3f} vs exemplar probe {probe:.3f}"),
              (worst <= bound, f"worst constrained max centred |Δlogit| at held-out generation positions, at the "
                               f"steering strength, over the seeds {worst:.3f} vs bound {bound:g}")]
    return "Target: " + "; ".join(f"{'met' if ok else 'MISSED'}: {text}" for ok, text in checks)


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


def first_questions(dataset, n: int | None):
    """``dataset`` cut to the rows of its first ``n`` groups (questions), in file order; all when ``n`` is None."""
    if not n:
        return dataset
    keep = set(list(dict.fromkeys(dataset.frame.group))[:n])
    return replace(dataset, frame=dataset.frame[dataset.frame.group.isin(keep)].reset_index(drop=True))


DEFAULTS = tsv.TSVSettings()  # what a run uses for any setting left unset (the help texts name them)


def _as_list(report) -> list[dict]:
    """A --json file holds one report (one seed) or a list of them."""
    return report if isinstance(report, list) else [report]


def main(argv: list[str] | None = None) -> int:
    """``python -m steer_ui.tools.tsv_tables --data FILE``: train on the embedded model and print the AUROC tables.

    TruthfulQA-shaped data is answered by the model first (greedy; the answers are cached under the cache root,
    so reruns only label them) and each answer labelled with TruthfulQA's similarity-difference rule.
    """
    p = argparse.ArgumentParser(prog="python -m steer_ui.tools.tsv_tables", description=main.__doc__)
    p.add_argument("--data", help="the dataset to train on (required unless --combine)")
    p.add_argument("--model", default=None)
    p.add_argument("--max-rows", type=int, default=None, help="subsample whole groups (questions) to this many rows")
    p.add_argument("--layer", type=int, default=None, help="default: the paper's relative depth")
    p.add_argument("--layer-sweep", type=int, default=None, help="blocks to sweep around the paper's depth")
    p.add_argument("--epochs", type=int, default=None, help="epochs of each stage (default 20)")
    p.add_argument("--exemplars", type=int, default=None)
    p.add_argument("--lam", type=float, default=None,
                   help=f"λ, the vector's training strength as a fraction of the block's mean residual norm "
                        f"(default {DEFAULTS.lam})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None,
                   help="comma-separated seeds (e.g. 0,1,2): one run per seed (its own split, exemplars and "
                        "initialisation), reported as mean ± sd")
    p.add_argument("--max-logit-change", type=float, default=None, help="the |Δlogit| bound (default 2.0)")
    p.add_argument("--penalty-positions", default=None, choices=("answer", "answer_and_end", "last"))
    p.add_argument("--bound-mode", default=None, choices=("calibrated", "steering_scale", "projection", "hinge"),
                   help="how the |Δlogit| bound is enforced (default: calibrated; see docs/tsv.md)")
    p.add_argument("--generate", default=None, choices=("auto", "yes", "no"),
                   help="label the model's own answers (auto: for TruthfulQA-shaped data)")
    p.add_argument("--bound-sweep", default=None,
                   help="comma-separated extra |Δlogit| bounds (e.g. 6,20): one more constrained run per bound, "
                        "reported as AUROC against the bound")
    p.add_argument("--max-questions", type=int, default=None,
                   help="keep the first N questions (groups) of the file, before anything else")
    p.add_argument("--calibration-rows", type=int, default=None,
                   help="training rows whose generation positions calibrate the steering strength (default "
                        f"{DEFAULTS.calibration_rows})")
    p.add_argument("--answer-shots", type=int, default=None,
                   help="worked examples of TruthfulQA's QA primer before each question the model answers "
                        f"(default {DEFAULTS.answer_shots}; 0: the template's zero-shot prompt)")
    p.add_argument("--json", help="also write the full report here")
    p.add_argument("--vector-out", help="also save the trained vector here (with several seeds: the last seed's), "
                                        "e.g. to generate with it")
    p.add_argument("--combine", nargs="+", metavar="REPORT.json",
                   help="print the seed table of reports written by earlier runs (--json), e.g. seeds run in "
                        "parallel processes, and train nothing")
    args = p.parse_args(argv)
    if args.combine:
        reports = [r for path in args.combine for r in _as_list(json.loads(Path(path).read_text()))]
        print(seeds_markdown(reports))
        return 0
    if not args.data:
        p.error("--data is required (or --combine REPORT.json ...)")
    dataset = first_questions(load_dataset(args.data), args.max_questions)
    handle = load_model(args.model)
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    reports = []
    for seed in seeds:
        hp = {"seed": seed, "max_rows": args.max_rows, "exemplars": args.exemplars, "lam": args.lam, "layer": args.layer,
              "layer_sweep": args.layer_sweep, "max_logit_change": args.max_logit_change,
              "penalty_positions": args.penalty_positions, "generate": args.generate,
              "bound_mode": args.bound_mode, "answer_shots": args.answer_shots,
              "calibration_rows": args.calibration_rows,
              "bound_sweep": parse_bounds(args.bound_sweep)}
        if args.epochs is not None:
            hp["epochs"] = args.epochs
        start = time.perf_counter()
        vector, report = tsv.train(handle, dataset, answers_cache=cache_root() / "tsv_answers",
                                    progress=lambda f, m: print(f"[{f:4.0%}] {m}", file=sys.stderr, flush=True),
                                    **{k: v for k, v in hp.items() if v is not None})
        report["seconds"] = round(time.perf_counter() - start, 1)
        report.pop("generated", None)  # the answers are in the cache; the JSON keeps the numbers
        reports.append(report)
        print(f"seed {seed}:\n" if len(seeds) > 1 else "", end="")
        print(table_markdown(report))
        lab = report["labelling"]
        labels = (f"{lab['answers']}, {lab['truthful']} truthful / {lab['hallucinated']} hallucinated"
                  if "truthful" in lab else lab["answers"])
        print(f"\nrows {report['rows']}, layer {report['layer']}, λ = {report['lam']} × mean norm = "
              f"{report['lam_raw']:.1f}, answers: {labels}, pseudo-labels {report['pseudo_labels'].get('counts')}, "
              f"{report['seconds']} s\n", flush=True)
    if len(reports) > 1:
        print(seeds_markdown(reports))
    if reports[0]["bound_sweep"]:
        print("\n" + bounds_markdown(reports))
    if args.vector_out:
        vector.save(args.vector_out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports[0] if len(reports) == 1 else reports, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
