"""Reading, validating and splitting the datasets users upload.

Every reader ends in one of three canonical shapes (``Dataset.kind``):

* ``statements``: ``prompt`` ("" here), ``completion`` (the statement),
  ``label`` (1 = true / truthful / positive, 0 = false), ``group``;
* ``answers``: ``prompt`` (the question), ``completion`` (the answer),
  ``label``, ``group`` (the question unless the file has a group column);
* ``pairs``: ``prompt``, ``positive``, ``negative``, ``group``.

Schemas are detected from column names (case-insensitive, spaces and
underscores alike) or forced with ``schema=``.  Everything is checked before
any model work; every problem is one :class:`DatasetError` whose message names
the file and, where it applies, the row (data rows counted from 1, header
excluded) and the column.  Nothing here ever unpickles anything.
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..messages import KeyedError, Said, said_of
from ..vector import dataset_hash

MAX_BYTES = 50 * 2**20
MAX_ROWS = 100_000
MAX_COLUMNS = 256
MAX_DECODED_BYTES = 256 * 2**20  # what a compressed upload (Parquet) may inflate to
# The character gate every cell passes as it is parsed, before anything copies, hashes or tokenises it (the
# policy's max_prompt_chars, which the service passes); a column's name has its own, smaller one.
MAX_CELL_CHARS = 4000
MAX_NAME_CHARS = 256
KINDS = ("statements", "answers", "pairs")
SCHEMAS = ("statements", "answers", "truthfulqa", "pairs", "caa")
LABELLED_COLUMNS = ["prompt", "completion", "label", "group"]
PAIR_COLUMNS = ["prompt", "positive", "negative", "group"]

TRUE_WORDS = {"true", "t", "yes", "y", "1", "1.0", "truthful", "correct", "positive", "pos", "right", "+", "+1"}
FALSE_WORDS = {"false", "f", "no", "n", "0", "0.0", "-1", "hallucinated", "hallucination", "incorrect", "negative",
               "neg", "wrong", "untruthful", "-"}

# Column aliases, compared after normalising names (lower case, runs of spaces/dashes -> "_").
STATEMENT_COLS = ("statement", "text", "sentence", "claim")
PROMPT_COLS = ("prompt", "question", "input", "context", "instruction")
COMPLETION_COLS = ("completion", "answer", "response", "output")
LABEL_COLS = ("label", "labels", "truth", "is_true", "truthful", "correct", "target")
POSITIVE_COLS = ("positive", "chosen", "pos", "positive_completion", "answer_matching_behavior")
NEGATIVE_COLS = ("negative", "rejected", "neg", "negative_completion", "answer_not_matching_behavior")
GROUP_COLS = ("group", "entity", "group_id")

# The role a missing column plays, said in the visitor's language (the aliases after it are column names)
ROLES = {"positive": Said("dataset_role_positive"), "negative": Said("dataset_role_negative"),
         "label": Said("dataset_role_label"), "prompt/question": Said("dataset_role_prompt"),
         "completion/answer": Said("dataset_role_completion"), "statement": Said("dataset_role_statement")}

_PICKLE_EXTS = {".pkl", ".pickle", ".pt", ".pth", ".joblib", ".npy", ".npz", ".ckpt"}
_TEXT_EXTS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl",
              ".parquet": "parquet", ".pq": "parquet", ".txt": None}


class DatasetError(KeyedError):
    """A dataset that cannot be used; the message names file, row and column where it applies.

    ``key`` and ``params``, when given, name the message in :mod:`steer_ui.messages`, so a front can say it in
    the visitor's language (the English text is the exception's own)."""


def _refusal(key: str, **params: Any) -> DatasetError:
    """A DatasetError whose message is ``key`` of :mod:`steer_ui.messages`, in English here."""
    return DatasetError.from_key(key, **params)


def _problem(name: str, key: str, **params: Any) -> DatasetError:
    """A DatasetError about file ``name``: "<name>: <detail>" in English, the detail said by ``key`` (so the page
    says "<name> could not be used: <detail>" in the visitor's language; the CLI's English is as it was)."""
    return DatasetError.from_key("dataset_problem", name=name, detail=Said(key, **params))


def _warning(key: str, **params: Any) -> Said:
    """A note about a file that was read anyway (rows dropped, UTF-16): English text, said by key on the page."""
    return Said(key, **params)


def _either(options: Sequence[str]) -> str:
    """``options`` as "a or b or c", the "or" said in the visitor's language."""
    said = options[0]
    for option in options[1:]:
        said = Said("dataset_or", first=said, last=option)
    return said


def _shown(column: Any) -> str:
    """A column's name as a one-line message shows it: at most 40 characters, no line breaks."""
    return " ".join(str(column)[:40].split())


# ------------------------------------------------------------------ record
@dataclass
class Dataset:
    """A validated dataset in canonical columns (see the module docstring)."""

    frame: pd.DataFrame
    kind: str
    schema: str
    source: str = ""
    warnings: list[str] = field(default_factory=list)
    content_hash: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        self.frame = self.frame.reset_index(drop=True)
        if not self.content_hash:
            self.content_hash = content_hash(self.frame, self.kind)

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def labelled(self) -> bool:
        return self.kind in ("statements", "answers")

    @property
    def labels(self) -> np.ndarray:
        if not self.labelled:
            raise _problem(self.source, "dataset_pairs_no_labels")
        return np.array(self.frame["label"].to_numpy(), dtype=np.int64)  # a writable copy

    @property
    def groups(self) -> list[str]:
        return self.frame["group"].astype(str).tolist()

    def subset(self, indices: Sequence[int], suffix: str = "") -> "Dataset":
        """The rows at ``indices`` (in that order) as a new Dataset with its own content hash."""
        frame = self.frame.iloc[list(indices)].reset_index(drop=True)
        return Dataset(frame=frame, kind=self.kind, schema=self.schema, source=self.source + suffix,
                       warnings=list(self.warnings))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source, "schema": self.schema, "kind": self.kind, "rows": len(self),
            "groups": int(self.frame["group"].nunique()), "content_hash": self.content_hash,
            "warnings": list(self.warnings),
        }
        if self.labelled:
            pos = int(self.frame["label"].sum())
            out.update({"positive": pos, "negative": len(self) - pos,
                        "positive_fraction": round(pos / max(len(self), 1), 4)})
        else:
            out["pairs"] = len(self)
        return out

    # ----------------------------------------------------------- conversions
    def as_labelled(self) -> "Dataset":
        """Pairs -> answers (each pair gives a label-1 and a label-0 row, same group); labelled kinds unchanged."""
        if self.labelled:
            return self
        f = self.frame
        pos = pd.DataFrame({"prompt": f["prompt"], "completion": f["positive"], "label": 1, "group": f["group"]})
        neg = pd.DataFrame({"prompt": f["prompt"], "completion": f["negative"], "label": 0, "group": f["group"]})
        # Interleave so row 2i is pair i's positive and 2i+1 its negative.
        frame = pd.concat([pos, neg]).sort_index(kind="stable").reset_index(drop=True)
        return Dataset(frame=frame, kind="answers", schema=self.schema, source=self.source, warnings=list(self.warnings))

    def as_pairs(self, seed: int = 0) -> "Dataset":
        """Labelled -> pairs: within each group, positives matched with negatives (the shorter list cycled).

        Groups holding only one class contribute nothing; if no group holds both
        classes (e.g. statements without a group column), positives and
        negatives are matched at random (seeded) and a warning says so.
        """
        if not self.labelled:
            return self
        rows = []
        for group, part in self.frame.groupby("group", sort=False):
            pos = part[part.label == 1]
            neg = part[part.label == 0]
            if len(pos) == 0 or len(neg) == 0:
                continue
            n = max(len(pos), len(neg))
            for i in range(n):
                p, q = pos.iloc[i % len(pos)], neg.iloc[i % len(neg)]
                if p.prompt == q.prompt:
                    rows.append((p.prompt, p.completion, q.completion, group))
                else:
                    rows.append(("", _join(p.prompt, p.completion), _join(q.prompt, q.completion), group))
        warnings = list(self.warnings)
        if not rows:
            rng = np.random.default_rng(seed)
            pos = self.frame[self.frame.label == 1].iloc[rng.permutation(int((self.frame.label == 1).sum()))]
            neg = self.frame[self.frame.label == 0].iloc[rng.permutation(int((self.frame.label == 0).sum()))]
            n = max(len(pos), len(neg))
            for i in range(n):
                p, q = pos.iloc[i % len(pos)], neg.iloc[i % len(neg)]
                rows.append(("", _join(p.prompt, p.completion), _join(q.prompt, q.completion), f"{p.group}|{q.group}"))
            warnings.append(_warning("dataset_warn_paired_at_random"))
        frame = pd.DataFrame(rows, columns=PAIR_COLUMNS)
        return Dataset(frame=frame, kind="pairs", schema=self.schema, source=self.source, warnings=warnings)


def _join(prompt: str, completion: str) -> str:
    if not prompt:
        return completion
    if prompt[-1].isspace() or not completion or completion[0].isspace():
        return prompt + completion
    return prompt + " " + completion


def content_hash(frame: pd.DataFrame, kind: str) -> str:
    cols = LABELLED_COLUMNS if kind != "pairs" else PAIR_COLUMNS
    rows = frame[cols].astype({"label": int} if kind != "pairs" else {}).values.tolist()
    return dataset_hash([kind, cols, rows])


# ------------------------------------------------------------------ entry
def load_dataset(source: Any, schema: str | None = None, max_bytes: int = MAX_BYTES, max_rows: int = MAX_ROWS,
                 filename: str | None = None, max_cell_chars: int = MAX_CELL_CHARS) -> Dataset:
    """Read and validate a dataset.

    ``source``: a path (str / Path), raw ``bytes`` (give ``filename`` so the
    format and messages are right), or a pandas DataFrame.  ``schema``: force
    one of ``statements``, ``answers``, ``truthfulqa``, ``pairs``, ``caa``
    (detected from the columns when None).  Every cell (the texts of a JSON
    list or object cell together) has at most ``max_cell_chars`` characters
    and every column name at most :data:`MAX_NAME_CHARS`, checked as the file
    is parsed, before any cell is copied, hashed or tokenised.  Raises
    :class:`DatasetError`.
    """
    if schema is not None and schema not in SCHEMAS:
        raise DatasetError.from_key("dataset_unknown_schema", schema=str(schema)[:40], known=", ".join(SCHEMAS))
    warnings: list[str] = []
    if isinstance(source, pd.DataFrame):
        name = filename or "<dataframe>"
        if len(source) > max_rows:
            raise _problem(name, "dataset_too_many_rows", rows=len(source), limit=max_rows)
        _bound_cells(source, name, max_cell_chars)
        records = source.copy()
        fmt = "dataframe"
    else:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            name = filename or "upload"
        elif isinstance(source, (str, Path)):
            path = Path(source).expanduser()
            name = filename or path.name
            if not path.is_file():
                raise DatasetError(f"dataset file not found: {path}")
            size = path.stat().st_size
            if size > max_bytes:
                raise _problem(name, "dataset_too_large", size=f"{size / 2**20:.1f}", limit=f"{max_bytes / 2**20:g}")
            data = path.read_bytes()
        else:
            raise DatasetError(f"cannot read a dataset from {type(source).__name__}; give a path, bytes or a DataFrame")
        if len(data) > max_bytes:
            raise _problem(name, "dataset_too_large", size=f"{len(data) / 2**20:.1f}", limit=f"{max_bytes / 2**20:g}")
        records, fmt = _parse_bytes(data, name, warnings, max_cell_chars)
        del data  # the parsed table is what is kept from here on
        _bound_cells(records, name, max_cell_chars)
        if len(records) > max_rows:
            raise _problem(name, "dataset_too_many_rows", rows=len(records), limit=max_rows)
    if len(records.columns) == 0:
        raise _problem(name, "dataset_no_columns", expected=Said("dataset_expected"))
    if len(records) == 0:
        raise _problem(name, "dataset_no_rows", columns=", ".join(map(str, records.columns)))
    return _canonical(records, name, schema, warnings)


# ------------------------------------------------------------------ parsing
def _parse_bytes(data: bytes, name: str, warnings: list[str],
                 max_cell_chars: int = MAX_CELL_CHARS) -> tuple[pd.DataFrame, str]:
    ext = Path(name).suffix.lower()
    if not data.strip():
        raise _problem(name, "dataset_empty")
    if (data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")) or ext in _PICKLE_EXTS:
        raise _problem(name, "dataset_pickle")
    if data[:4] == b"PAR1" or ext in (".parquet", ".pq"):
        return _read_parquet(data, name), "parquet"
    text = _decode(data, name, warnings)
    if not text.strip():
        raise _problem(name, "dataset_empty")
    fmt = _TEXT_EXTS.get(ext)
    if fmt is None:
        first_line = _first_line(text)
        if first_line[:1] in ("[", "{"):
            fmt = "json"
        else:
            fmt = "tsv" if "\t" in first_line else "csv"
    if fmt == "json":
        return _read_json(text, name, max_cell_chars), fmt
    if fmt == "jsonl":
        return _read_jsonl(text, name, max_cell_chars), fmt
    return _read_delimited(text, name, "\t" if fmt == "tsv" else ","), fmt


def _first_line(text: str) -> str:
    """The first non-blank line of ``text`` without its leading spaces, copying nothing else of the file."""
    start = re.compile(r"\s*").match(text).end()
    brk = _LINE_BREAK.search(text, start)
    return text[start:] if brk is None else text[start:brk.start()]


def _lines(text: str):
    """(line number, line) of every non-blank line (ended by LF, CRLF or CR), one line copied at a time
    (``str.splitlines`` would copy the whole file at once, and break lines inside JSON strings at U+2028)."""
    start, lineno = 0, 0
    for brk in _LINE_BREAK.finditer(text):
        lineno += 1
        line = text[start:brk.start()]
        start = brk.end()
        if line.strip():
            yield lineno, line
    if start < len(text) and text[start:].strip():
        yield lineno + 1, text[start:]


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _read_parquet(data: bytes, name: str) -> pd.DataFrame:
    """A Parquet table, checked from its footer before anything is decompressed.

    Parquet compresses well: a file under the upload limit can declare
    gigabytes of rows.  The footer states rows, columns and every row group's
    uncompressed size, so a bomb is refused before one page is inflated.
    """
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(io.BytesIO(data)).metadata
    except Exception:  # pyarrow raises several types for junk, in its own words
        raise _refusal("data_not_parquet", name=name) from None
    if meta.num_columns > MAX_COLUMNS:
        raise _problem(name, "dataset_too_many_columns", columns=meta.num_columns, limit=MAX_COLUMNS)
    if meta.num_rows > MAX_ROWS:
        raise _problem(name, "dataset_rows_limit", rows=meta.num_rows, limit=MAX_ROWS)
    inflated = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if inflated > MAX_DECODED_BYTES:
        raise _problem(name, "dataset_inflates", size=f"{inflated / 2**20:.0f}", limit=f"{MAX_DECODED_BYTES / 2**20:g}")
    try:
        return pd.read_parquet(io.BytesIO(data))
    except Exception:
        raise _refusal("data_not_parquet", name=name) from None


def _decode(data: bytes, name: str, warnings: list[str]) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError:
            raise _refusal("data_not_utf16", name=name) from None
        warnings.append(_warning("dataset_warn_utf16", name=name))
        return text
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    sample = data[:65536]
    controls = sum(1 for b in sample if b < 32 and b not in (9, 10, 13))
    if b"\x00" in sample or controls > max(2, len(sample) // 100):
        raise _problem(name, "dataset_binary")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise _refusal("data_not_utf8", name=name, byte=f"0x{data[exc.start]:02x}", line=line) from None


def _read_delimited(text: str, name: str, sep: str) -> pd.DataFrame:
    kind = "TSV" if sep == "\t" else "CSV"
    header = _first_line(text)
    if header.count(sep) + 1 > MAX_COLUMNS:  # a wide header would make pandas allocate per column first
        raise _problem(name, "dataset_too_many_columns", columns=header.count(sep) + 1, limit=MAX_COLUMNS)
    del header
    try:
        # as UTF-8 bytes: a text buffer (StringIO) would hold the file at four bytes a character
        frame = pd.read_csv(io.BytesIO(text.encode("utf-8")), sep=sep, dtype=str, keep_default_na=False,
                            skip_blank_lines=True, encoding="utf-8")
    except pd.errors.EmptyDataError:
        raise _problem(name, "dataset_empty") from None
    except (pd.errors.ParserError, ValueError) as exc:
        key, params = table_problem(str(exc))
        raise _refusal(key, name=name, kind=kind, **params) from None
    return frame


def table_problem(message: str) -> tuple[str, dict[str, int]]:
    """pandas' CSV/TSV parser message as (message key, params) in plain words: the library's own text ("Error
    tokenizing data. C error: EOF inside string starting at row 3") says how its tokenizer failed, not what is
    wrong with the file.  Its "row" counts lines from 0, the header included."""
    opened = re.search(r"EOF inside string starting at row (\d+)", message)
    if opened:
        return "data_open_quote", {"line": int(opened.group(1)) + 1}
    cells = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
    if cells:
        return "data_cell_count", {"line": int(cells.group(2)), "saw": int(cells.group(3)),
                                   "expected": int(cells.group(1))}
    return "data_not_a_table", {}


# json's messages, by their start, and what each means for the person who wrote the file
JSON_PROBLEMS = (("Unterminated string", "json_open_string"), ("Expecting ',' delimiter", "json_missing_comma"),
                 ("Expecting ':' delimiter", "json_missing_colon"), ("Expecting property name", "json_field_name"),
                 ("Expecting value", "json_missing_value"), ("Extra data", "json_extra_data"),
                 ("Invalid control character", "json_control_character"), ("Invalid \\u", "json_bad_escape"),
                 ("Invalid \\escape", "json_bad_escape"))


def json_problem(exc: json.JSONDecodeError, line: int | None = None) -> tuple[str, dict[str, int]]:
    """A JSON syntax error as (message key, params) in plain words, where it is (``line``: the file's line for
    a JSON-lines row, whose parser counts from its own first line)."""
    key = next((k for start, k in JSON_PROBLEMS if exc.msg.startswith(start)), "json_syntax")
    return key, {"line": exc.lineno if line is None else line, "column": exc.colno}


def _read_json(text: str, name: str, max_cell_chars: int = MAX_CELL_CHARS) -> pd.DataFrame:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        # A JSON-lines file with a .json name parses line by line.
        first = [line for _, line in zip(range(5), (ln for _, ln in _lines(text)))]
        if len(first) > 1 and all(ln.lstrip().startswith("{") for ln in first):
            return _read_jsonl(text, name, max_cell_chars)
        key, params = json_problem(exc)
        raise _refusal(key, name=name, **params) from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, or a number of thousands of digits
        raise _refusal(_json_problem(exc), name=name, line=1) from None
    if isinstance(obj, dict):
        lists = [v for v in obj.values() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
        if len(lists) == 1:
            obj = lists[0]
        elif obj and all(isinstance(v, list) for v in obj.values()):
            for key, values in obj.items():  # columns: each cell bounded before a frame is made of them
                for i, value in enumerate(values, start=1):
                    _bound_cell(name, i, key, value, max_cell_chars)
            try:
                return pd.DataFrame(obj)
            except ValueError:  # pandas' words ("All arrays must be of the same length") add nothing
                raise _problem(name, "dataset_json_unequal_columns") from None
        else:
            raise _problem(name, "dataset_json_object", keys=[_shown(k) for k in sorted(obj)[:8]])
    if not isinstance(obj, list):
        raise _problem(name, "dataset_json_not_list", type=type(obj).__name__)
    for i, row in enumerate(obj, start=1):
        if not isinstance(row, dict):
            raise _problem(name, "dataset_json_row", row=i, type=type(row).__name__)
        _bound_row(name, i, row, max_cell_chars)
    return pd.DataFrame(obj)


def _read_jsonl(text: str, name: str, max_cell_chars: int = MAX_CELL_CHARS) -> pd.DataFrame:
    rows = []
    for lineno, line in _lines(text):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            key, params = json_problem(exc, lineno)
            raise _refusal(key, name=name, **params) from None
        except (RecursionError, ValueError) as exc:
            raise _refusal(_json_problem(exc), name=name, line=lineno) from None
        if not isinstance(row, dict):
            raise _problem(name, "dataset_jsonl_line", line=lineno, type=type(row).__name__)
        _bound_row(name, len(rows) + 1, row, max_cell_chars)  # as parsed: a long cell stops the file here
        rows.append(row)
    return pd.DataFrame(rows)


def _json_problem(exc: BaseException) -> str:
    """The message key for JSON that parses but cannot be read (the parser's own words name its internals,
    such as sys.set_int_max_str_digits)."""
    if isinstance(exc, RecursionError):
        return "json_too_deep"
    if "digits" in str(exc):
        return "json_huge_number"
    return "json_unreadable"


# ------------------------------------------------------------------ bounds
def text_chars(value: Any) -> int:
    """Characters of one cell: a text's length; for a list or object (JSON, Parquet) the texts within it and
    its keys together; 0 for numbers and empty cells."""
    if type(value) is str:
        return len(value)
    total, stack = 0, [value]
    while stack:  # by hand, not recursion: a cell may nest deeply
        item = stack.pop()
        if isinstance(item, (str, bytes, bytearray)):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)) or (isinstance(item, np.ndarray) and item.dtype == object):
            stack.extend(item)
        elif isinstance(item, np.ndarray) and item.dtype.kind in "US":
            total += int(np.char.str_len(item).sum())
    return total


def column_chars(series: pd.Series) -> np.ndarray | None:
    """Characters of each cell of a column (:func:`text_chars`), None for a column that cannot hold text
    (numbers, booleans, dates).  Text columns backed by Arrow are measured there, without a copy of any text."""
    dtype = series.dtype
    if pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype) or \
            pd.api.types.is_datetime64_any_dtype(dtype):
        return None
    if isinstance(dtype, pd.StringDtype) or (isinstance(dtype, pd.ArrowDtype) and pd.api.types.is_string_dtype(dtype)):
        return series.str.len().fillna(0).to_numpy(dtype=np.int64)
    values = series.to_numpy(dtype=object) if dtype == object else series
    return np.fromiter((text_chars(v) for v in values), dtype=np.int64, count=len(series))


def first_long_cell(frame: pd.DataFrame, limit: int) -> tuple[int, Any, int] | None:
    """(row index, column, characters) of the first cell, in reading order (row by row), with more than
    ``limit`` characters; None when every cell is within it."""
    first = None
    for j in range(frame.shape[1]):  # by position: a DataFrame may repeat a column's name
        column, chars = frame.columns[j], column_chars(frame.iloc[:, j])
        if chars is None:
            continue
        over = np.flatnonzero(chars > limit)
        if over.size and (first is None or over[0] < first[0]):
            first = (int(over[0]), column, int(chars[over[0]]))
    return first


def _bound_name(name: str, column: Any) -> None:
    size = len(str(column))
    if size > MAX_NAME_CHARS:
        raise _refusal("column_name_too_long", name=name, column=_shown(column), size=size, limit=MAX_NAME_CHARS)


def _bound_cell(name: str, row: int, column: Any, value: Any, limit: int) -> None:
    size = text_chars(value)
    if size > limit:
        _bound_name(name, column)
        raise _refusal("cell_too_long", name=name, row=row, column=_shown(column), size=size, limit=limit)


def _bound_row(name: str, row: int, record: dict, limit: int) -> None:
    for column, value in record.items():
        _bound_name(name, column)
        _bound_cell(name, row, column, value, limit)


def _bound_cells(records: pd.DataFrame, name: str, limit: int) -> None:
    """Every column name and cell of a parsed table within its character bound, or one DatasetError naming
    the file, the row (data rows from 1) and the column of the first that is not."""
    if records.columns.size > MAX_COLUMNS:
        raise _problem(name, "dataset_too_many_columns", columns=records.columns.size, limit=MAX_COLUMNS)
    for column in records.columns:
        _bound_name(name, column)
    first = first_long_cell(records, limit)
    if first is not None:
        row, column, size = first
        raise _refusal("cell_too_long", name=name, row=row + 1, column=_shown(column), size=size, limit=limit)


# ------------------------------------------------------------------ schemas
def _norm(col: Any) -> str:
    return re.sub(r"[\s\-]+", "_", str(col).replace("\ufeff", "").strip().lower())


def _pick(cols: dict[str, str], aliases: Sequence[str]) -> str | None:
    for a in aliases:
        if a in cols:
            return cols[a]
    return None


def detect_schema(columns: Sequence[Any]) -> str | None:
    """The schema name the columns fit, or None."""
    cols = {_norm(c): c for c in columns}
    if {"question", "correct_answers", "incorrect_answers"} <= set(cols):
        return "truthfulqa"
    if {"answer_matching_behavior", "answer_not_matching_behavior"} <= set(cols):
        return "caa"
    has_label = _pick(cols, LABEL_COLS) is not None
    if _pick(cols, POSITIVE_COLS) and _pick(cols, NEGATIVE_COLS):
        return "pairs"
    if has_label and _pick(cols, PROMPT_COLS) and _pick(cols, COMPLETION_COLS):
        return "answers"
    if has_label and _pick(cols, STATEMENT_COLS):
        return "statements"
    return None


def _canonical(records: pd.DataFrame, name: str, schema: str | None, warnings: list[str]) -> Dataset:
    records = records.reset_index(drop=True)
    found = [_shown(c) for c in records.columns]
    detected = detect_schema(records.columns)
    schema = schema or detected
    if schema is None:
        raise _problem(name, "dataset_no_schema", found=", ".join(found), expected=Said("dataset_expected"))
    cols = {_norm(c): c for c in records.columns}

    def need(aliases: Sequence[str], role: str) -> str:
        col = _pick(cols, aliases)
        if col is None:
            raise _problem(name, "dataset_needs_column", schema=schema, role=ROLES[role],
                           aliases=_either(aliases[:4]), found=", ".join(found))
        return col

    group_col = _pick(cols, GROUP_COLS)
    if schema == "truthfulqa":
        frame, kind = _expand_truthfulqa(records, name, cols, warnings), "answers"
    elif schema in ("pairs", "caa"):
        pos = need(POSITIVE_COLS, "positive")
        neg = need(NEGATIVE_COLS, "negative")
        prompt = _pick(cols, PROMPT_COLS)
        frame = pd.DataFrame({
            "prompt": _text_column(records, prompt, name) if prompt else "",
            "positive": _text_column(records, pos, name),
            "negative": _text_column(records, neg, name),
        })
        kind = "pairs"
        frame["group"] = _text_column(records, group_col, name) if group_col else \
            (frame["prompt"] if prompt else frame["positive"])
        frame = _drop_blank(frame, ["positive", "negative"], name, warnings)
    else:
        label_col = need(LABEL_COLS, "label")
        if schema == "answers":
            prompt = _text_column(records, need(PROMPT_COLS, "prompt/question"), name)
            completion = _text_column(records, need(COMPLETION_COLS, "completion/answer"), name)
        else:
            completion = _text_column(records, need(STATEMENT_COLS, "statement"), name)
            prompt = pd.Series([""] * len(records))
        labels = _parse_labels(records[label_col], name, _shown(label_col))
        frame = pd.DataFrame({"prompt": prompt, "completion": completion, "label": labels})
        if group_col:
            frame["group"] = _text_column(records, group_col, name)
        else:
            frame["group"] = frame["prompt"] if schema == "answers" else frame["completion"]
        kind = "answers" if schema == "answers" else "statements"
        frame = _drop_blank(frame, ["completion"], name, warnings)
    frame = _drop_duplicates(frame, kind, name, warnings)
    if len(frame) == 0:
        raise _problem(name, "dataset_no_usable_rows")
    if kind != "pairs":
        counts = frame["label"].value_counts()
        if len(counts) < 2:
            key = "dataset_all_true" if int(counts.index[0]) == 1 else "dataset_all_false"
            raise _problem(name, key, rows=len(frame))
    return Dataset(frame=frame, kind=kind, schema=schema, source=name, warnings=warnings)


def _text_column(records: pd.DataFrame, col: Any, name: str) -> pd.Series:
    out = []
    for i, v in enumerate(records[col].tolist(), start=1):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            out.append("")
        elif isinstance(v, str):
            out.append(v)
        elif isinstance(v, (int, float, np.integer, np.floating, bool)):
            out.append(str(v))
        else:
            raise _problem(name, "dataset_not_text", row=i, column=_shown(col), type=type(v).__name__)
    return pd.Series(out, dtype=object)


def _parse_labels(series: pd.Series, name: str, col: str) -> list[int]:
    out = []
    for i, v in enumerate(series.tolist(), start=1):
        if isinstance(v, (bool, np.bool_)):
            out.append(int(bool(v)))
            continue
        if isinstance(v, (int, float, np.integer, np.floating)) and not (isinstance(v, float) and np.isnan(v)):
            if float(v) in (0.0, 1.0):
                out.append(int(v))
                continue
        word = "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v).strip().lower()
        if word in TRUE_WORDS:
            out.append(1)
        elif word in FALSE_WORDS:
            out.append(0)
        else:
            if word:
                raise _problem(name, "dataset_label_unreadable", row=i, column=col, value=str(v)[:40])
            raise _problem(name, "dataset_label_empty", row=i, column=col)
    return out


def _drop_blank(frame: pd.DataFrame, cols: list[str], name: str, warnings: list[str]) -> pd.DataFrame:
    blank = np.zeros(len(frame), dtype=bool)
    for c in cols:
        blank |= frame[c].astype(str).str.strip().eq("").to_numpy()
    if blank.any():
        rows = (np.flatnonzero(blank) + 1).tolist()
        warnings.append(_warning("dataset_warn_blank", name=name, count=len(rows), columns="/".join(cols),
                                 rows=_few(rows)))
        frame = frame[~blank]
    return frame.reset_index(drop=True)


def _drop_duplicates(frame: pd.DataFrame, kind: str, name: str, warnings: list[str]) -> pd.DataFrame:
    frame = frame.reset_index(drop=True)
    if kind == "pairs":
        dup = frame.duplicated(subset=["prompt", "positive", "negative"], keep="first")
        if dup.any():
            warnings.append(_warning("dataset_warn_duplicates", name=name, count=int(dup.sum()),
                                     rows=_few(_rows_of(frame, dup))))
        return frame[~dup].reset_index(drop=True)
    conflict = frame.groupby(["prompt", "completion"], sort=False)["label"].transform("nunique") > 1
    if conflict.any():
        warnings.append(_warning("dataset_warn_conflicts", name=name, count=int(conflict.sum()),
                                 rows=_few(_rows_of(frame, conflict))))
        frame = frame[~conflict]
    dup = frame.duplicated(subset=["prompt", "completion", "label"], keep="first")
    if dup.any():
        warnings.append(_warning("dataset_warn_duplicates", name=name, count=int(dup.sum()),
                                 rows=_few(_rows_of(frame, dup))))
        frame = frame[~dup]
    return frame.reset_index(drop=True)


def _rows_of(frame: pd.DataFrame, mask: pd.Series) -> list[int]:
    # Row numbers of the canonical frame (1-based); for files without expansion these are the file's data rows.
    return (frame.index[mask.to_numpy()] + 1).tolist()


def _few(rows: list[int], n: int = 8) -> str:
    shown = ", ".join(map(str, rows[:n]))
    return Said("dataset_rows_more", rows=shown, more=len(rows) - n) if len(rows) > n else shown


def _split_answers(cell: Any) -> list[str]:
    if cell is None or (isinstance(cell, float) and np.isnan(cell)):
        return []
    if isinstance(cell, (list, tuple, np.ndarray)):
        return [str(a).strip() for a in cell if str(a).strip()]
    return [a.strip() for a in str(cell).split(";") if a.strip()]


def _expand_truthfulqa(records: pd.DataFrame, name: str, cols: dict[str, str], warnings: list[str]) -> pd.DataFrame:
    q_col, c_col, i_col = cols["question"], cols["correct_answers"], cols["incorrect_answers"]
    best_col, cat_col = cols.get("best_answer"), cols.get("category")
    rows = []
    questions = _text_column(records, q_col, name)
    one_sided = []
    for i, question in enumerate(questions, start=1):
        question = question.strip()
        if not question:
            raise _problem(name, "dataset_question_empty", row=i, column=_shown(q_col))
        correct = _split_answers(records.at[i - 1, c_col])
        incorrect = _split_answers(records.at[i - 1, i_col])
        best = str(records.at[i - 1, best_col]).strip() if best_col else ""
        if best and best not in correct:
            correct.insert(0, best)
        if not correct and not incorrect:
            raise _problem(name, "dataset_answers_empty", row=i, correct=_shown(c_col), incorrect=_shown(i_col))
        if not correct or not incorrect:
            one_sided.append(i)
        category = str(records.at[i - 1, cat_col]) if cat_col else ""
        rows += [(question, a, 1, question, category, a == best) for a in correct]
        rows += [(question, a, 0, question, category, False) for a in incorrect]
    if one_sided:
        warnings.append(_warning("dataset_warn_one_sided", name=name, count=len(one_sided), rows=_few(one_sided)))
    frame = pd.DataFrame(rows, columns=LABELLED_COLUMNS + ["category", "best"])
    warnings.append(_warning("dataset_warn_expanded", name=name, questions=len(questions), answers=len(frame)))
    return frame


# ------------------------------------------------------------------ splits
def group_split(groups: Sequence[str], labels: Sequence[int] | None = None, test_fraction: float = 0.25,
                seed: int = 0) -> tuple[list[int], list[int]]:
    """Row indices (train, test) with whole groups on one side only: the one group split of the project.

    Groups are sorted into strata by their label make-up (all true, all
    false, mixed; one stratum without ``labels``); each stratum sends
    ``round(test_fraction · groups)`` of its groups (at least one when it has
    two or more) to test, chosen by a permutation seeded with ``seed``.
    """
    if not 0 < test_fraction < 1:
        raise _refusal("split_test_fraction", value=test_fraction)
    groups = pd.Series([str(g) for g in groups])
    if groups.nunique() < 2:
        first = groups.iloc[0] if len(groups) else None
        raise _refusal("split_one_group", group=repr(first))
    if labels is not None:
        frame = pd.DataFrame({"group": groups, "label": list(labels)})
        make_up = frame.groupby("group", sort=True)["label"].agg(lambda s: "mixed" if s.nunique() > 1 else str(s.iloc[0]))
    else:
        make_up = pd.Series("all", index=sorted(groups.unique()))
    rng = np.random.default_rng(seed)
    test_groups: set[str] = set()
    for _stratum, members in make_up.groupby(make_up, sort=True):
        names = sorted(members.index)
        order = rng.permutation(len(names))
        n_test = int(round(test_fraction * len(names)))
        if len(names) >= 2:
            n_test = min(max(n_test, 1), len(names) - 1)
        test_groups.update(names[j] for j in order[:n_test])
    is_test = groups.isin(test_groups).to_numpy()
    train, test = np.flatnonzero(~is_test).tolist(), np.flatnonzero(is_test).tolist()
    if not train or not test:
        raise _refusal("split_too_few_groups", count=groups.nunique())
    return train, test


def split_indices(dataset: Dataset, test_fraction: float = 0.25, seed: int = 0) -> tuple[list[int], list[int]]:
    """Row indices (train, test) of ``dataset`` split by its ``group`` column (see :func:`group_split`)."""
    frame = dataset.frame
    labels = frame["label"].tolist() if dataset.labelled else None
    try:
        return group_split(frame["group"].astype(str).tolist(), labels, test_fraction, seed)
    except DatasetError as exc:  # "<source>: <why>", the why said by key
        raise DatasetError.from_key("dataset_problem", name=str(dataset.source), detail=said_of(exc)) from None


def split_by_group(dataset: Dataset, test_fraction: float = 0.25, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(train, test) Datasets; see :func:`split_indices`."""
    train, test = split_indices(dataset, test_fraction, seed)
    return dataset.subset(train, " [train]"), dataset.subset(test, " [test]")
