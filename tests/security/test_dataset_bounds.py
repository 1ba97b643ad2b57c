"""Bounded at the door (issue #46, finding 1): a dataset cell passes the character gate as the file is parsed,
before anything copies, hashes or tokenises it; a job's texts are counted in tokens without tokenising more than
the limits allow.  A 40 MB CSV cell used to upload (74 s, the app at 3.1 GB) and then grow the app to 7.6 GB
on /train while the tokenizer counted its 20,971,521 tokens.

The first half runs the readers and the guard in this process, on a tiny model, and measures what they did: the
memory they allocated (tracemalloc) and every character handed to the tokenizer (a counting tokenizer).  The
second half sends the same files to the running app over HTTP: each is refused in one line naming the file,
the row (data rows from 1) and the column, in the visitor's language; the app's memory stays where it was; the
honest session's numbers stay exact."""
from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from steer_ui import guards
from steer_ui.data import DatasetError, load_dataset
from steer_ui.data.datasets import MAX_CELL_CHARS
from steer_ui.guards import Guard, longest_token_chars
from steer_ui.messages import UserError
from steer_ui.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ROOT / "assets" / "datasets"
MB = 1 << 20
BIG = "a " * (20 << 20)  # the cell: 40 MB, 20,971,521 Gemma tokens
TEN_MB = "x " * (5 << 20)


# ------------------------------------------------------------------------------------------ the files
def csv_statements(path: Path, cell: str) -> Path:
    """The issue's file: one huge statement labelled 1, then one short row."""
    path.write_text("statement,label\n" + cell + ",1\nParis is in France.,0\n", encoding="utf-8")
    return path


def jsonl_statements(path: Path, cell: str) -> Path:
    """A JSONL whose second row's statement is ``cell``."""
    rows = [{"statement": "Paris is in France.", "label": 1}, {"statement": cell, "label": 0},
            {"statement": "Rome is in Spain.", "label": 0}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def csv_pairs(path: Path, cell: str) -> Path:
    """A pairs CSV whose third row's negative is ``cell``."""
    lines = ["prompt,positive,negative"] + [f"Question {i}?,Yes {i}.,No {i}." for i in range(4)]
    lines[3] = f"Question 2?,Yes 2.,{cell}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


CASES = {  # file name -> (writer, cell, row, column), the row counted from 1 over data rows
    "big_cell.csv": (csv_statements, BIG, 1, "statement"),
    "big_cell.jsonl": (jsonl_statements, TEN_MB, 2, "statement"),
    "big_pairs.csv": (csv_pairs, TEN_MB, 3, "negative"),
}


def one_line(message: str) -> str:
    assert len(message.strip().splitlines()) == 1, message
    assert len(message) < 400, message[:400]
    assert "Traceback" not in message, message
    return message


# ------------------------------------------------------------------------------------------ the readers
@pytest.mark.parametrize("file", list(CASES))
def test_a_huge_cell_is_refused_as_the_file_is_parsed_naming_file_row_and_column(tmp_path, file):
    write, cell, row, column = CASES[file]
    path = write(tmp_path / file, cell)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        with pytest.raises(DatasetError) as info:
            load_dataset(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    error = info.value
    assert error.key == "cell_too_long"
    assert error.params == {"name": file, "row": row, "column": column, "size": len(cell), "limit": MAX_CELL_CHARS}
    message = one_line(str(error))
    assert f"{file} could not be used: row {row}, column '{column}' has {len(cell)} characters" in message
    # the file as read and parsed, a few times over at most: no canonical copies, no hashing, no tokens (the
    # whole load, which did all of that, peaked at 7 times the file)
    assert peak < 5 * size, f"{peak / MB:.0f} MB allocated reading a {size / MB:.0f} MB file"


def test_the_cell_gate_is_the_policys_and_counts_the_texts_inside_json_cells(tmp_path):
    rows = [{"statement": "ok", "label": 1}, {"statement": "fine", "label": 0},
            {"statement": "also fine", "label": 0, "notes": ["y" * 3000, {"k": "z" * 1500}]}]
    path = tmp_path / "nested.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    assert info.value.params == {"name": "nested.jsonl", "row": 3, "column": "notes", "size": 4501, "limit": 4000}
    assert len(load_dataset(path, max_cell_chars=5000)) == 3  # a server with a wider gate reads it
    with pytest.raises(DatasetError) as info:
        load_dataset(DATASETS / "capitals_statements.csv", max_cell_chars=10)
    assert info.value.key == "cell_too_long" and info.value.params["row"] == 1


def test_a_huge_column_name_is_refused_and_never_echoed(tmp_path):
    path = tmp_path / "wide_name.csv"
    path.write_text("statement,label," + "n" * (5 * MB) + "\nParis is in France.,1,x\nRome is in Spain.,0,y\n")
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    assert info.value.key == "column_name_too_long" and info.value.params["size"] == 5 * MB
    one_line(str(info.value))


def test_json_too_deep_or_with_a_huge_number_is_one_plain_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    digits = tmp_path / "digits.jsonl"
    digits.write_text('{"statement": "a", "label": ' + "1" * 5000 + "}\n")
    for path, words in ((deep, "nested too deeply"), (digits, "thousands of digits")):
        with pytest.raises(DatasetError) as info:
            load_dataset(path)
        message = one_line(str(info.value))
        assert words in message and "set_int_max_str_digits" not in message


def test_honest_files_load_exactly_as_before():
    """The gate changes nothing it lets through: the bundled files' rows and content hashes (what vectors'
    provenance and the activation cache are keyed on) are the ones made before it existed."""
    expected = {"capitals_pairs.csv": (324, "cb2fd1a1626b19a9"), "capitals_statements.csv": (264, "cf78efa8915dc755"),
                "qa_answers.csv": (126, "782571d67d1d8c78"), "science_pairs.csv": (90, "9bb87ccadf410b84"),
                "science_statements.csv": (360, "5228c2d927c0d415"), "sentiment_pairs.csv": (40, "974dcdaed05554de")}
    for name, (rows, content_hash) in expected.items():
        dataset = load_dataset(DATASETS / name)
        assert (len(dataset), dataset.content_hash) == (rows, content_hash), name


# ------------------------------------------------------------------------------------------ the guard
class CountingTokenizer:
    """The model's tokenizer, counting every character it is handed."""

    def __init__(self, tokenizer):
        self.inner, self.chars, self.calls = tokenizer, 0, 0

    def __call__(self, texts, **kwargs):
        self.calls += 1
        self.chars += sum(map(len, [texts] if isinstance(texts, str) else texts))
        return self.inner(texts, **kwargs)

    def get_vocab(self):
        return self.inner.get_vocab()


@pytest.fixture
def counted(tiny):
    return SimpleNamespace(tokenizer=CountingTokenizer(tiny("llama").tokenizer))


def frame_dataset(rows: list[dict]):
    import pandas as pd

    # as a script or a future reader might hand one over: past the parse-time gate
    return load_dataset(pd.DataFrame(rows), max_cell_chars=1 << 30, filename="direct.csv")


def test_the_guard_refuses_a_huge_cell_by_characters_without_tokenising_it(counted):
    dataset = frame_dataset([{"statement": TEN_MB, "label": 1}, {"statement": "Paris is in France.", "label": 0}])
    with pytest.raises(UserError) as info:
        Guard(Policy()).dataset(counted, dataset)
    assert info.value.key == "row_too_many_chars"
    assert info.value.params == {"row": 1, "column": "completion", "size": len(TEN_MB), "limit": 4000}
    assert counted.tokenizer.chars == 0 and counted.tokenizer.calls == 0
    one_line(str(info.value))


def test_texts_longer_together_than_the_token_limit_can_span_are_refused_by_characters(counted):
    longest = longest_token_chars(counted.tokenizer)
    assert 1 <= longest <= 16  # the tiny model's byte tokenizer: its longest entry is "<unk>"
    policy = Policy(max_train_tokens=2000)
    rows = [{"statement": f"{i} " + "b" * 3000, "label": i % 2} for i in range(8)]  # 24,000+ characters
    with pytest.raises(UserError) as info:
        Guard(policy).dataset(counted, frame_dataset(rows))
    assert info.value.key == "data_too_many_chars"
    assert info.value.params["chars"] == sum(len(r["statement"]) for r in rows)
    assert info.value.params["longest"] == longest and info.value.params["limit"] == 2000
    assert counted.tokenizer.chars == 0


def test_counting_stops_within_one_chunk_of_passing_the_total(counted, monkeypatch):
    """Within the character bound, texts are tokenised a chunk at a time and counting stops once the total
    passes its limit: the tokenizer never sees the rest of the file."""
    monkeypatch.setattr(guards, "TOKENIZE_CHUNK_CHARS", 4096)
    longest = longest_token_chars(counted.tokenizer)
    limit = 20_000
    rows = [{"statement": f"{i:03d} " + "c" * 996, "label": i % 2} for i in range(limit * longest // 1000 - 1)]
    total_chars = sum(len(r["statement"]) for r in rows)
    assert limit < total_chars <= limit * longest  # over in tokens (one per byte), not provably by characters
    with pytest.raises(UserError) as info:
        Guard(Policy(max_train_tokens=limit)).dataset(counted, frame_dataset(rows))
    assert info.value.key == "data_too_large" and info.value.params["tokens"] > limit
    assert counted.tokenizer.chars <= limit + 4096 + 1000 < total_chars
    one_line(str(info.value))


def test_a_text_over_the_token_limit_is_still_counted_exactly(counted):
    rows = [{"statement": f"Fact {i}.", "label": i % 2} for i in range(6)]
    rows[4]["statement"] = "é" * 3000  # 3,000 characters, two byte tokens each
    with pytest.raises(UserError) as info:
        Guard(Policy()).dataset(counted, frame_dataset(rows))
    assert info.value.key == "row_too_long"
    assert info.value.params == {"row": 5, "column": "completion", "tokens": 6000, "limit": 1024}


def test_an_honest_dataset_is_counted_once_and_passes(counted):
    dataset = load_dataset(DATASETS / "qa_answers.csv")
    Guard(Policy()).dataset(counted, dataset)
    frame = dataset.frame
    assert counted.tokenizer.chars == sum(len(t) for c in ("prompt", "completion") for t in frame[c])


# ------------------------------------------------------------------------------------------ over HTTP
def _rss(server) -> int:
    return server.ps.memory_info().rss


@pytest.mark.parametrize("file", list(CASES))
def test_the_app_refuses_a_huge_cell_in_one_line_and_keeps_its_memory(server, honest, tmp_path, file):
    from gradio_client import handle_file

    from hostile_kit import client, refused

    write, cell, row, column = CASES[file]
    path = write(tmp_path / file, cell)
    c = client(server)
    c.predict("capitals_statements.csv", "auto", api_name="/bundled_dataset")  # the session's data before
    before = _rss(server)
    message = refused(lambda: c.predict(handle_file(str(path)), "auto", api_name="/upload_dataset"),
                      file, f"row {row}", f"column '{column}'", f"{len(cell)} characters", "4000")
    one_line(message)
    assert _rss(server) - before < 400 * MB, f"the app grew {(_rss(server) - before) / MB:.0f} MB"
    # refused before it was kept: the session still holds the bundled file, and trains on it
    *_, summary = c.predict(handle_file(str(DATASETS / "qa_answers.csv")), "auto", api_name="/upload_dataset")
    assert summary["name"] == "qa_answers.csv" and summary["rows"] == 126
    honest(full=False)


def test_the_refusal_is_in_the_visitors_language(server, honest, tmp_path):
    from gradio_client import handle_file

    from hostile_kit import client, refused

    path = jsonl_statements(tmp_path / "zh_cell.jsonl", TEN_MB)
    c = client(server)
    assert c.predict("zh-CN", api_name="/set_language") == "zh-CN"
    message = refused(lambda: c.predict(handle_file(str(path)), "auto", api_name="/upload_dataset"),
                      "zh_cell.jsonl", "第 2 行", "statement", str(len(TEN_MB)))
    assert re.search(r"[\u4e00-\u9fff]{4}", message), message
    honest(full=False)


def test_training_after_the_refusal_reads_nothing_of_the_file(server, honest, tmp_path):
    """The issue's sequence: upload the 40 MB cell, then /train.  The upload is refused, so the job finds no
    data (it used to tokenise 20,971,521 tokens and grow the app to 7.6 GB before refusing)."""
    from gradio_client import handle_file

    from hostile_kit import client, refused

    path = csv_statements(tmp_path / "issue.csv", BIG)
    c = client(server)
    before = _rss(server)
    refused(lambda: c.predict(handle_file(str(path)), "auto", api_name="/upload_dataset"), "row 1", "characters")
    refused(lambda: c.predict("mean-diff", 6, False, "{}", api_name="/train"), "no dataset")
    refused(lambda: c.predict("last", 0, api_name="/probe_layers"), "no dataset")
    assert _rss(server) - before < 400 * MB
    honest()


def test_a_huge_prompt_list_is_refused_by_characters_before_any_token_is_counted(server, honest):
    from hostile_kit import RANDOM, client, refused

    c = client(server)
    refused(lambda: c.predict("x " * (MB // 2), False, RANDOM, 6, 0.5, True, 0, 1.0, 4, api_name="/compare"),
            "1048576 characters", "256000")
    lines = "\n".join(["A short prompt."] * 3 + ["y" * 5000])
    refused(lambda: c.predict(lines, False, RANDOM, 6, 0.5, True, 0, 1.0, 4, api_name="/compare"),
            "5000 characters", "4000")
    honest(full=False)


def test_the_apps_peak_memory_over_these_cases_stays_under_the_suites_cap(server):
    from hostile_kit import MEMORY_CAP

    assert 0 < server.peak_rss < MEMORY_CAP, f"peak RSS {server.peak_rss / 2**30:.2f} GB"
    print(f"\npeak RSS of the app so far: {server.peak_rss / 2**30:.2f} GB")
