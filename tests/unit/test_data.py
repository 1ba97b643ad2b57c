"""Dataset readers: each schema, each bad-file kind, group splits."""
from __future__ import annotations

import json
import pickle

import pandas as pd
import pytest

from steer_ui.data import Dataset, DatasetError, load_dataset, split_by_group, split_indices
from conftest import DATASETS, NEEDS_TRUTHFULQA, TRUTHFULQA

STATEMENTS_CSV = "statement,label\nParis is in France.,true\nParis is in Spain.,False\nRome is in Italy.,YES\nRome is in Peru.,no\n"


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


# ------------------------------------------------------------------ schemas
def test_statements_csv_labels_case_insensitive(tmp_path):
    ds = load_dataset(write(tmp_path, "s.csv", STATEMENTS_CSV))
    assert ds.kind == "statements" and ds.schema == "statements"
    assert list(ds.frame.columns[:4]) == ["prompt", "completion", "label", "group"]
    assert ds.frame.label.tolist() == [1, 0, 1, 0]
    assert ds.frame.prompt.tolist() == [""] * 4
    assert ds.summary()["positive"] == 2 and ds.summary()["negative"] == 2


def test_statements_truthful_hallucinated_and_group_column(tmp_path):
    text = "text,label,group\nA is a.,truthful,a\nA is b.,Hallucinated,a\nB is b.,1,b\nB is a.,0,b\n"
    ds = load_dataset(write(tmp_path, "s.csv", text))
    assert ds.frame.label.tolist() == [1, 0, 1, 0]
    assert ds.groups == ["a", "a", "b", "b"]


def test_answers_tsv_question_answer_columns(tmp_path):
    text = "question\tanswer\tlabel\nWhat is 2+2?\t4\ttrue\nWhat is 2+2?\t5\tfalse\n"
    ds = load_dataset(write(tmp_path, "qa.tsv", text))
    assert ds.kind == "answers"
    assert ds.frame.prompt.tolist() == ["What is 2+2?"] * 2
    assert ds.frame.completion.tolist() == ["4", "5"]
    assert ds.groups == ["What is 2+2?"] * 2  # the question is the group


def test_answers_jsonl_and_json_and_parquet_agree(tmp_path):
    rows = [{"prompt": "Q1", "completion": "yes", "label": True}, {"prompt": "Q1", "completion": "no", "label": False},
            {"prompt": "Q2", "completion": "maybe", "label": 1}]
    jsonl = load_dataset(write(tmp_path, "a.jsonl", "\n".join(json.dumps(r) for r in rows)))
    js = load_dataset(write(tmp_path, "a.json", json.dumps(rows)))
    pq_path = tmp_path / "a.parquet"
    pd.DataFrame(rows).astype({"label": bool}).to_parquet(pq_path)
    pq = load_dataset(pq_path)
    assert jsonl.content_hash == js.content_hash == pq.content_hash
    assert pq.frame.label.tolist() == [1, 0, 1]


def test_truthfulqa_expansion_small(tmp_path):
    text = ("Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers\n"
            "A,Myths,Do bulls hate red?,No,No; Bulls are colour-blind to red,Yes; They charge red\n"
            "A,Myths,Is the moon cheese?,No,No,Yes\n")
    ds = load_dataset(write(tmp_path, "tqa.csv", text))
    assert ds.schema == "truthfulqa" and ds.kind == "answers"
    first = ds.frame[ds.frame.group == "Do bulls hate red?"]
    assert sorted(first[first.label == 1].completion) == ["Bulls are colour-blind to red", "No"]
    assert sorted(first[first.label == 0].completion) == ["They charge red", "Yes"]
    assert ds.frame.category.unique().tolist() == ["Myths"]


@NEEDS_TRUTHFULQA
def test_truthfulqa_real_file_parses_817_questions():
    ds = load_dataset(TRUTHFULQA)
    assert ds.frame.group.nunique() == 817
    per_q = ds.frame.groupby("group").label.agg(["min", "max"])
    assert ((per_q["min"] == 0) & (per_q["max"] == 1)).all()


def test_pairs_csv_and_caa_json(tmp_path):
    pairs = load_dataset(write(tmp_path, "p.csv", "prompt,positive,negative\nI feel,great,awful\nIt was,lovely,horrid\n"))
    assert pairs.kind == "pairs" and pairs.frame.positive.tolist() == ["great", "lovely"]
    caa = [{"question": "Do you agree? (A) yes (B) no", "answer_matching_behavior": "(A)",
            "answer_not_matching_behavior": "(B)"}]
    ds = load_dataset(write(tmp_path, "caa.json", json.dumps(caa)))
    assert ds.schema == "caa" and ds.kind == "pairs"
    assert ds.frame.iloc[0].to_dict() == {"prompt": caa[0]["question"], "positive": "(A)", "negative": "(B)",
                                          "group": caa[0]["question"]}
    labelled = ds.as_labelled()
    assert labelled.frame.label.tolist() == [1, 0] and labelled.frame.completion.tolist() == ["(A)", "(B)"]


def test_schema_override_and_dataframe_and_bytes():
    frame = pd.DataFrame({"text": ["a", "b"], "label": [1, 0]})
    assert load_dataset(frame).kind == "statements"
    ds = load_dataset(STATEMENTS_CSV.encode(), filename="up.csv", schema="statements")
    assert ds.source == "up.csv" and len(ds) == 4
    with pytest.raises(DatasetError, match="schema 'answers' needs a prompt"):
        load_dataset(STATEMENTS_CSV.encode(), filename="up.csv", schema="answers")


def test_utf8_bom_tolerated(tmp_path):
    ds = load_dataset(write(tmp_path, "bom.csv", b"\xef\xbb\xbf" + STATEMENTS_CSV.encode()))
    assert len(ds) == 4


def test_as_pairs_within_group():
    frame = pd.DataFrame({"prompt": ["q", "q", "q", "r", "r"], "completion": ["a", "b", "c", "d", "e"],
                          "label": [1, 0, 0, 1, 0], "group": ["q", "q", "q", "r", "r"]})
    pairs = Dataset(frame=frame, kind="answers", schema="answers").as_pairs()
    assert pairs.frame[["positive", "negative"]].values.tolist() == [["a", "b"], ["a", "c"], ["d", "e"]]


# --------------------------------------------------------------- bad files
def test_error_empty(tmp_path):
    with pytest.raises(DatasetError, match=r"e\.csv: the file is empty"):
        load_dataset(write(tmp_path, "e.csv", ""))


def test_error_header_only(tmp_path):
    with pytest.raises(DatasetError, match=r"h\.csv: has a header \(statement, label\) but no data rows"):
        load_dataset(write(tmp_path, "h.csv", "statement,label\n"))


def test_error_unrecognised_columns_lists_found_and_expected(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_dataset(write(tmp_path, "u.csv", "foo,bar\n1,2\n"))
    msg = str(err.value)
    assert "u.csv" in msg and "found [foo, bar]" in msg and "statement,label" in msg and "prompt,positive,negative" in msg


def test_error_unparseable_label_names_row_and_column(tmp_path):
    text = "statement,label\nA.,true\nB.,false\nC.,maybe\n"
    with pytest.raises(DatasetError, match=r"l\.csv: row 3, column 'label': cannot read 'maybe' as a label"):
        load_dataset(write(tmp_path, "l.csv", text))


def test_error_single_class(tmp_path):
    with pytest.raises(DatasetError, match=r"one\.csv: every row is labelled true"):
        load_dataset(write(tmp_path, "one.csv", "statement,label\nA.,true\nB.,yes\n"))


def test_duplicates_reported_and_dropped(tmp_path):
    text = STATEMENTS_CSV + "Paris is in France.,true\n"
    ds = load_dataset(write(tmp_path, "d.csv", text))
    assert len(ds) == 4
    assert any("dropped 1 duplicate row(s): rows 5" in w for w in ds.warnings)


def test_error_over_size(tmp_path):
    path = write(tmp_path, "big.csv", "statement,label\n" + "".join(f"S{i}.,{i % 2}\n" for i in range(200)))
    with pytest.raises(DatasetError, match=r"big\.csv: file is .* MB, over the limit"):
        load_dataset(path, max_bytes=1000)
    with pytest.raises(DatasetError, match=r"big\.csv: 200 rows, over the limit of 100 rows"):
        load_dataset(path, max_rows=100)


def test_error_binary_junk(tmp_path):
    junk = bytes(range(256)) * 8
    with pytest.raises(DatasetError, match=r"junk\.csv: looks like binary data"):
        load_dataset(write(tmp_path, "junk.csv", junk))


def test_error_bad_encoding(tmp_path):
    text = "statement,label\nCafé is a word.,true\nX.,false\n".encode("latin-1")
    with pytest.raises(DatasetError, match=r"lat\.csv: not valid UTF-8 \(byte 0xe9 on line 2\)"):
        load_dataset(write(tmp_path, "lat.csv", text))


def test_error_pickle_never_loaded(tmp_path):
    blob = pickle.dumps([{"statement": "a", "label": 1}])
    with pytest.raises(DatasetError, match="pickle"):
        load_dataset(write(tmp_path, "data.csv", blob))  # content sniffed, not trusted by extension
    with pytest.raises(DatasetError, match="pickle"):
        load_dataset(write(tmp_path, "data.pkl", b"anything"))


def test_error_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_dataset(tmp_path / "nope.csv")


# ------------------------------------------------------------------ splits
def test_group_split_has_no_leakage_and_is_stratified_and_seeded():
    rows = []
    for g in range(40):
        rows.append({"prompt": "", "completion": f"fact {g} true", "label": 1, "group": f"g{g}"})
        rows.append({"prompt": "", "completion": f"fact {g} false", "label": 0, "group": f"g{g}"})
    for g in range(40, 60):  # single-class groups
        rows.append({"prompt": "", "completion": f"only {g}", "label": g % 2, "group": f"g{g}"})
    ds = Dataset(frame=pd.DataFrame(rows), kind="statements", schema="statements", source="t")
    train, test = split_by_group(ds, test_fraction=0.25, seed=3)
    assert not set(train.groups) & set(test.groups)
    assert len(train) + len(test) == len(ds)
    assert 0.2 <= test.frame.group.nunique() / 60 <= 0.3
    assert 0.4 <= test.frame.label.mean() <= 0.6 and 0.4 <= train.frame.label.mean() <= 0.6
    assert split_indices(ds, 0.25, seed=3) == split_indices(ds, 0.25, seed=3)
    assert split_indices(ds, 0.25, seed=3) != split_indices(ds, 0.25, seed=4)


@pytest.mark.parametrize("name", ["capitals_statements.csv", "science_statements.csv"])
def test_bundled_statements_are_balanced_within_every_group(name):
    # what the cards promise: each group (country, or element / animal / word) has two true and two false
    # rows, so a split by group keeps both sides balanced and a detector cannot key on the item alone
    data = load_dataset(DATASETS / name)
    frame = data.frame
    assert data.schema == "statements" and len(frame) % 4 == 0
    per_group = frame.groupby("group")["label"].agg(["sum", "count"])
    assert (per_group["count"] == 4).all() and (per_group["sum"] == 2).all()
    assert frame["completion"].is_unique  # a statement's text is its completion (empty prompt)
