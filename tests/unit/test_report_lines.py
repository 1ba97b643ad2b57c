"""The Train tab's lines under its status, worded from a report's numbers in the page's language."""
import re

import pandas as pd

from steer_ui.methods.l2s.evaluation import recommendation
from steer_ui.methods.tsv.labelling import labelling_rule, labelling_summary
from steer_ui.methods.tsv.training import bound_check
from steer_ui.ui.i18n import plain
from steer_ui.ui.report_lines import status_lines

# names that stay as they are in a Chinese sentence: methods, a dataset, a metric and its unit
KEPT = {"L2S", "TSV", "Mean", "ROUGE", "LCS", "TruthfulQA", "logit"}


def latin_words(lines: list[str]) -> set[str]:
    return {w for line in lines for w in re.findall(r"[A-Za-z]{3,}", line)} - KEPT


def tsv_report(tiny) -> dict:
    """A TSV report's labelling and bound check from the methods' own functions: 3 of 4 positions kept bound 2."""
    handle = tiny("llama")
    labelled = pd.DataFrame({"label": [1, 0, 0]})
    labelled.attrs.update(metric="rouge_l", empty_answers=1, shots=2, prompt="Q: {question}",
                          rule=labelling_rule("rouge_l", 0.5))
    frame = pd.DataFrame({"prompt": ["p0", "p1"], "completion": ["一个 *回答* <b>", "fine"]})
    places = [(0, 0, 5), (0, 1, 6), (1, 0, 7), (1, 1, 8)]
    check = bound_check(handle, frame, (places, [1.0, 3.5, 0.5, 1.5]), limit=2.0)
    return {"labelling": labelling_summary(labelled), "runs": {"constrained": {"bound_check": check}}}


def test_tsv_lines_say_the_notes_facts_in_english_and_no_english_in_chinese(tiny):
    report = tsv_report(tiny)
    en = status_lines("en", report)
    assert len(en) == 2
    assert en[0].startswith("Labels: the model's own greedy answers to 4 questions, after 2 worked examples")
    assert "1 truthful / 2 hallucinated, 1 empty answers dropped" in en[0] and "reaches 0.5" in en[0]
    assert en[1].startswith("The |Δlogit| bound 2 held at 3 of 4 held-out generation positions; 1 positions in 1 "
                            "of 2 rows broke it (worst 3.50, at answer token 1 of")
    assert en[1] == report["runs"]["constrained"]["bound_check"]["note"].replace(
        "'一个 *回答* <b>'", plain("'一个 *回答* <b>'"))  # the method's own sentence, its answer shown as text
    assert "<b>" not in en[1] and "\\*回答\\*" in en[1]  # the dataset's answer shown as text, not markup
    zh = status_lines("zh-CN", report)
    assert len(zh) == 2 and latin_words(zh) == set(), zh
    assert "3.50" in zh[1] and "0.57" in zh[1] and "{" not in "".join(zh)


def test_l2s_verdict_in_both_languages_from_the_held_out_numbers():
    held = {"margin_gain": {"l2s": 0.31, "mean": 0.12}, "l2s_minus_mean": {"mean": 0.19, "se": 0.05},
            "n_steered": 24, "alpha": {"l2s": 0.4567}}
    beats, advice = recommendation(held, 0.5)
    report = {**held, "norm_budget": 0.5, "l2s_beats_mean": beats, "recommendation": advice}
    assert status_lines("en", report) == [advice]  # the method's own sentence, word for word
    zh = status_lines("zh-CN", report)
    assert latin_words(zh) == set() and "+0.31" in zh[0] and "0.457" in zh[0]
    worse = {**held, "l2s_minus_mean": {"mean": -0.1, "se": 0.05}, "residual_weight": 0}
    beats, advice = recommendation(worse, 0.5)
    report = {**worse, "norm_budget": 0.5, "l2s_beats_mean": beats, "recommendation": advice}
    assert status_lines("en", report) == [advice]
    assert latin_words(status_lines("zh-CN", report)) == set()


def test_a_report_without_the_numbers_keeps_its_own_sentence_as_text():
    report = {"recommendation": "Use <i>this</i>", "labelling": {"note": "Labels: *old*"},
              "runs": {"constrained": {"bound_check": {"note": "The bound held."}}}}
    assert status_lines("zh-CN", report) == [plain("Use <i>this</i>"), plain("Labels: *old*"), "The bound held."]
    assert status_lines("en", {"layer": 3}) == []
