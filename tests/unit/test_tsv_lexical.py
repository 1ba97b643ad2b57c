"""Lexical labelling for TSV's generate-and-label mode, and the mode itself on a tiny model."""
from __future__ import annotations

import pandas as pd
import pytest

from steer_ui import lexical
from steer_ui.methods import tsv


def test_tokens_drop_case_punctuation_and_articles():
    assert lexical.tokens("The Eiffel Tower, in Paris!") == ["eiffel", "tower", "in", "paris"]


def test_rouge_l_is_the_lcs_f_measure():
    assert lexical.rouge_l("the cat sat on the mat", "The cat sat on the mat.") == 1.0
    # candidate "cat sat mat" (3), reference "cat sat on mat" (4): LCS 3 -> P=1, R=3/4, F=6/7
    assert lexical.rouge_l("cat sat mat", "cat sat on mat") == pytest.approx(6 / 7)
    assert lexical.rouge_l("dog", "cat") == 0.0
    assert lexical.rouge_l("", "cat") == 0.0


def test_rouge_l_respects_order_and_token_f1_does_not():
    assert lexical.rouge_l("paris capital france", "france capital paris") == pytest.approx(1 / 3)
    assert lexical.token_f1("paris capital france", "france capital paris") == 1.0


def test_label_answer_compares_best_correct_with_best_incorrect():
    correct = ["Nothing happens", "The seeds pass through your digestive system"]
    incorrect = ["You grow watermelons in your stomach", "You get sick"]
    label, to_c, to_i = lexical.label_answer("The seeds pass through you", correct, incorrect)
    assert label == 1 and to_c > to_i
    label, to_c, to_i = lexical.label_answer("Watermelons grow in your stomach", correct, incorrect)
    assert label == 0 and to_i > to_c


def test_label_answer_uses_the_threshold_without_incorrect_references():
    assert lexical.label_answer("Paris", ["Paris"], [])[0] == 1
    assert lexical.label_answer("London is big", ["Paris"], [], threshold=0.5)[0] == 0


def test_split_references_reads_truthfulqa_lists():
    assert lexical.split_references("a; b ;c") == ["a", "b", "c"]
    assert lexical.split_references(["x", " "]) == ["x"]
    assert lexical.split_references(float("nan")) == []


def test_clean_answer_stops_at_a_new_question():
    assert tsv.clean_answer(" Paris. Q: What is") == "Paris."
    assert tsv.clean_answer("Eight\nAnswer the question") == "Eight"


def test_generate_and_label_answers_and_labels_each_question(tiny):
    h = tiny("llama")
    questions = pd.DataFrame({
        "Question": ["What is two plus two?", "What colour is the sky?"],
        "Best Answer": ["Four", "Blue"],
        "Correct Answers": ["Four; 4", "Blue; The sky is blue"],
        "Incorrect Answers": ["Five", "Green"],
    })
    out = tsv.generate_and_label(h, questions, max_new_tokens=6)
    assert list(out.columns[:4]) == ["prompt", "completion", "label", "group"]
    assert len(out) + out.attrs["empty_answers"] == 2
    for _, row in out.iterrows():
        expected = lexical.label_answer(row.completion, row.correct_answers.split("; "),
                                        row.incorrect_answers.split("; "))[0]
        assert row.label == expected
        assert row.group == row.prompt


def test_generate_and_label_reads_labelled_rows_as_references(tiny):
    h = tiny("llama")
    rows = [("What is two plus two?", "Four", 1), ("What is two plus two?", "Five", 0)]
    table = tsv.question_table(rows)
    assert table.correct.tolist() == [["Four"]] and table.incorrect.tolist() == [["Five"]]
    with pytest.raises(tsv.TSVError, match="needs questions"):
        tsv.question_table([("Paris is in France.", 1), ("Paris is in Peru.", 0)])
