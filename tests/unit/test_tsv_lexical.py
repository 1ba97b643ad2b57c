"""Lexical labelling for TSV's generate-and-label mode, and the mode itself on a tiny model."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from steer_ui import lexical
from steer_ui.methods import parse_settings
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


def _questions(n):
    return pd.DataFrame({
        "Question": [f"What is {i} plus {'one' * (1 + i % 3)}?" for i in range(n)],
        "Correct Answers": [f"{i + 1}; It is {i + 1}" for i in range(n)],
        "Incorrect Answers": [f"{i + 2}; It is {i}" for i in range(n)],
    })


def test_batched_left_padded_answers_equal_one_at_a_time(tiny):
    """Prompts of different lengths in one left-padded batch get the answers each gets alone."""
    h = tiny("gemma3")  # the tiny llama answers only whitespace; this one says varied things
    questions = _questions(5).Question.tolist()
    batched = tsv.generate_answers(h, questions, max_new_tokens=5, batch_size=5)
    alone = [tsv.generate_answers(h, [q], max_new_tokens=5, batch_size=1)[0] for q in questions]
    assert batched == alone
    assert len(set(batched)) > 1 and all(batched)


def test_generated_answers_are_cached_and_read_back(tiny, tmp_path):
    h = tiny("llama")
    first = tsv.generate_and_label(h, _questions(3), max_new_tokens=4, cache_dir=tmp_path)
    files = list(tmp_path.glob("answers-*.json"))
    assert len(files) == 1
    # a rerun reads the file: prove it by editing what it holds
    import json

    answers = json.loads(files[0].read_text())
    answers[0] = "It is 1"
    files[0].write_text(json.dumps(answers))
    second = tsv.generate_and_label(h, _questions(3), max_new_tokens=4, cache_dir=tmp_path)
    assert second.completion[0] == "It is 1" and second.label[0] == 1
    assert second.completion.tolist()[1:] == first.completion.tolist()[1:]
    # another answer length is another key
    tsv.generate_and_label(h, _questions(3), max_new_tokens=5, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("answers-*.json"))) == 2


def test_truthfulqa_shaped_data_trains_on_the_models_own_answers_by_default(tiny, tmp_path):
    import json

    from steer_ui.data import load_dataset

    h = tiny("llama")
    path = tmp_path / "tqa.csv"
    _questions(16).to_csv(path, index=False)
    data = load_dataset(path)
    assert data.schema == "truthfulqa" and tsv.is_question_table(data)
    settings = parse_settings(tsv.TSVSettings, {"layer": 1, "epochs": 1, "exemplars": 4, "compare": False})
    assert settings.generate == "auto" and tsv.generates(settings, data)
    # A random model's answers are noise; put known ones in its answer cache, the way a rerun would read them:
    # right for even questions, wrong for odd ones, one left empty (dropped).
    cache = tmp_path / "answers"
    tsv.generate_and_label(h, data, cache_dir=cache, shots=settings.answer_shots)  # the training's call reads this
    (answers_file,) = cache.glob("answers-*.json")
    chosen = [f"It is {i + 1}" if i % 2 == 0 else f"It is {i}" for i in range(16)]
    chosen[3] = ""
    answers_file.write_text(json.dumps(chosen))
    _v, report = tsv.train(h, data, settings, answers_cache=cache)
    lab = report["labelling"]
    assert lab["answers"] == "the model's own greedy answers" and "ROUGE-L" in lab["rule"]
    assert lab["shots"] == tsv.MAX_SHOTS and lab["answer_prompt"].endswith("Q: {question}\nA:")
    assert lab["note"].startswith("Labels: the model's own greedy answers to 16 questions, after 5 worked examples "
                                  "of TruthfulQA's QA primer: 8 truthful / 7 hallucinated, 1 empty answers dropped.")
    # the Train tab shows that line under its status
    from steer_ui.ui.train_tab import train_outputs

    status = train_outputs(None, "en", "tsv", report)[0]
    assert lab["note"] in status and lab["rule"] in status
    assert (lab["truthful"], lab["hallucinated"], lab["empty_answers_dropped"]) == (8, 7, 1)
    assert lab["truthful_share"] == round(8 / 15, 4) and report["rows"]["total"] == 15
    assert [r["completion"] for r in report["generated"]] == [a for a in chosen if a]
    assert report["label_balance"] == {"truthful": 8, "hallucinated": 7}
    # "no" keeps the dataset's reference answers (2 per question here)
    _v, ref_report = tsv.train(h, data, replace(settings, generate="no"))
    assert ref_report["labelling"] == {"answers": "the dataset's own labelled rows"}
    assert ref_report["rows"]["total"] == len(data.frame) == 64


def test_labelled_answers_are_not_regenerated_by_default():
    rows = tsv.rows_of([("What is 1 plus one?", "2", 1), ("What is 1 plus one?", "3", 0)])
    assert not tsv.is_question_table(rows)
    assert tsv.generates(parse_settings(tsv.TSVSettings, {"generate": "yes"}), rows)
    assert not tsv.generates(parse_settings(tsv.TSVSettings, {}), rows)


def test_answer_prompt_is_the_template_or_the_qa_primer_before_the_question():
    assert tsv.answer_prompt("Why?", shots=0) == tsv.prefix_text("Why?") == "Answer the question concisely. Q: Why? A:"
    two = tsv.answer_prompt(" Why? ", shots=2)
    (q1, a1), (q2, a2) = tsv.QA_PRIMER[:2]
    assert two == f"Q: {q1}\nA: {a1}\n\nQ: {q2}\nA: {a2}\n\nQ: Why?\nA:"
    assert "no comment" not in tsv.answer_prompt("Why?", shots=tsv.MAX_SHOTS).lower()  # the shortcut pair is left out
    for bad in (-1, tsv.MAX_SHOTS + 1):
        with pytest.raises(tsv.TSVError, match="answer shots must be in 0..5"):
            tsv.answer_prompt("Why?", shots=bad)
    with pytest.raises(ValueError, match="answer_shots"):
        parse_settings(tsv.TSVSettings, {"answer_shots": 6})  # bounded on the server, whatever the form allows


def test_the_primer_reaches_the_model_and_has_its_own_cache_key(tiny, tmp_path):
    import hashlib
    import json

    h = tiny("gemma3")  # the tiny llama answers only whitespace; this one says varied things
    questions = _questions(4)
    zero = tsv.generate_and_label(h, questions, max_new_tokens=5, cache_dir=tmp_path)
    primed = tsv.generate_and_label(h, questions, max_new_tokens=5, cache_dir=tmp_path, shots=3)
    assert zero.attrs["shots"] == 0 and primed.attrs["shots"] == 3
    assert primed.attrs["prompt"] == tsv.answer_prompt("{question}", shots=3)
    # what the model answers after the primer is what it says when given the primed prompt itself
    by_hand = [tsv.clean_answer(t) for t in _greedy(h, [tsv.answer_prompt(q, shots=3) for q in questions.Question], 5)]
    assert primed.completion.tolist() == [a for a in by_hand if a]
    assert primed.completion.tolist() != zero.completion.tolist()
    files = sorted(tmp_path.glob("answers-*.json"))
    assert len(files) == 2
    # zero shots keep the key of the caches written before the primer existed
    old_key = json.dumps([h.model_id, str(h.dtype), tsv.PROMPT_TEMPLATE, 5, questions.Question.tolist()])
    assert tmp_path / f"answers-{hashlib.sha256(old_key.encode()).hexdigest()[:24]}.json" in files


def _greedy(h, prompts, n):
    """Greedy continuations, one prompt at a time, by Hugging Face's own generate (no batching, no padding)."""
    import torch

    out = []
    for p in prompts:
        ids = h.tokenizer(p, return_tensors="pt").input_ids
        with torch.inference_mode():
            row = h.model.generate(input_ids=ids, max_new_tokens=n, do_sample=False, num_beams=1,
                                   pad_token_id=h.tokenizer.pad_token_id or 0, eos_token_id=h.tokenizer.eos_token_id)
        out.append(h.tokenizer.decode(row[0, ids.shape[1]:], skip_special_tokens=True))
    return out
