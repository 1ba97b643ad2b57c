"""The sentences a training report adds under the Train tab's status line, in the page's language.

A method's report keeps its own English sentences (``note``, ``recommendation``) for the JSON a client or the CLI
reads; the page words the same facts from the report's numbers instead, so a 简体中文 page shows no English
sentence under its status line (a browser review found three: L2S's verdict, TSV's labels and its |Δlogit|
bound).  A report without the numbers (an older saved one) keeps its English sentence.
"""
from __future__ import annotations

from typing import Any

from . import i18n


# the labelling metric's name, by the key the report gives it
METRIC_MESSAGES = {"rouge_l": "tsv_metric_rouge_l", "token_f1": "tsv_metric_token_f1"}


def status_lines(lang: str, report: dict) -> list[str]:
    """Markdown lines for ``report``: L2S's verdict, TSV's generated labels, TSV's held-out |Δlogit| bound."""
    lines = [_l2s_verdict(lang, report), _labelling(lang, report.get("labelling")),
             _bound_check(lang, ((report.get("runs") or {}).get("constrained") or {}).get("bound_check"))]
    return [line for line in lines if line]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _l2s_verdict(lang: str, report: dict) -> str | None:
    advice = report.get("recommendation")
    if not isinstance(advice, str):
        return None
    gain, alpha = report.get("margin_gain") or {}, report.get("alpha") or {}
    if not (isinstance(report.get("l2s_beats_mean"), bool) and _number(gain.get("l2s")) and _number(gain.get("mean"))
            and _number(report.get("n_steered")) and _number(report.get("norm_budget"))):
        return i18n.plain(advice)
    numbers = dict(l2s=f"{gain['l2s']:+.2f}", mean=f"{gain['mean']:+.2f}", n=int(report["n_steered"]),
                   budget=f"{report['norm_budget']:g}")
    if report["l2s_beats_mean"] and _number(alpha.get("l2s")):
        return i18n.message(lang, "l2s_verdict_beats", alpha=f"{alpha['l2s']:.3g}", **numbers)
    line = i18n.message(lang, "l2s_verdict_not", **numbers)
    if report.get("residual_weight") == 0:
        line += " " + i18n.message(lang, "l2s_verdict_weight_zero")
    return line


def _labelling(lang: str, labelling: Any) -> str | None:
    if not isinstance(labelling, dict):
        return None
    keys = ("questions", "shots", "truthful", "hallucinated", "empty_answers_dropped", "threshold")
    if not all(_number(labelling.get(k)) for k in keys) or labelling.get("metric") not in METRIC_MESSAGES:
        return i18n.plain(labelling["note"]) if isinstance(labelling.get("note"), str) else None
    prompt = i18n.message(lang, "tsv_labels_shots", shots=int(labelling["shots"])) if labelling["shots"] \
        else i18n.message(lang, "tsv_labels_zero_shot")
    dropped = i18n.message(lang, "tsv_labels_dropped", n=int(labelling["empty_answers_dropped"])) \
        if labelling["empty_answers_dropped"] else ""
    metric = i18n.message(lang, METRIC_MESSAGES[labelling["metric"]])
    return i18n.message(lang, "tsv_labels", questions=int(labelling["questions"]), prompt=prompt,
                        truthful=int(labelling["truthful"]), hallucinated=int(labelling["hallucinated"]),
                        dropped=dropped, rule=i18n.message(lang, "tsv_labels_rule", metric=metric,
                                                           threshold=f"{labelling['threshold']:g}"))


def _bound_check(lang: str, check: Any) -> str | None:
    if not isinstance(check, dict):
        return None
    keys = ("limit", "positions", "positions_over", "rows", "rows_over")
    if not all(_number(check.get(k)) for k in keys):
        return i18n.plain(check["note"]) if isinstance(check.get("note"), str) else None
    over = int(check["positions_over"])
    worst = (check.get("worst_rows") or [None])[0]
    kept = (check.get("with_limit") or {}).get("least_kept")
    broken = ""
    if over and isinstance(worst, dict) and _number(worst.get("max_abs_delta_logit")) and _number(kept):
        answer = str(worst.get("answer", ""))
        answer = answer if len(answer) <= 60 else answer[:59] + "…"
        broken = i18n.message(lang, "tsv_bound_broken", over=over, rows_over=int(check["rows_over"]),
                              rows=int(check["rows"]), worst=f"{worst['max_abs_delta_logit']:.2f}",
                              token=worst.get("answer_token", "?"), answer=i18n.plain(repr(answer)),
                              kept=f"{kept:.2f}")
    return i18n.message(lang, "tsv_bound_held", limit=f"{check['limit']:g}", kept=int(check["positions"]) - over,
                        positions=int(check["positions"]), broken=broken)
