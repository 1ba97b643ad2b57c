"""Issue #52, language and messages, as pure functions: parser errors in plain words (both languages, never the
library's own text), one toast per refusal, and the redraw a language switch makes from what a page shows."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from steer_ui.data.datasets import DatasetError, json_problem, load_dataset, table_problem
from steer_ui.ui import i18n

LIBRARY_WORDS = ("tokenizing", "C error", "EOF", "Expecting", "delimiter", "char ", "b'")


def _in_both(exc) -> list[str]:
    """The refusal in each language, as the page says it."""
    return [i18n.message(lang, exc.key, **exc.params) for lang in i18n.LANGS]


def _plain(texts: list[str]) -> None:
    for text in texts:
        assert not any(word in text for word in LIBRARY_WORDS), text


# ------------------------------------------------------------------ CSV / TSV
@pytest.mark.parametrize("message, key, params", [
    ("Error tokenizing data. C error: EOF inside string starting at row 2", "data_open_quote", {"line": 3}),
    ("Error tokenizing data. C error: Expected 2 fields in line 3, saw 3\n", "data_cell_count",
     {"line": 3, "saw": 3, "expected": 2}),
    ("Error tokenizing data. C error: Buffer overflow caught - possible malformed input file.", "data_not_a_table", {}),
])
def test_pandas_parser_messages_become_plain_problems(message, key, params):
    assert table_problem(message) == (key, params)


def test_an_unclosed_quote_in_a_csv_names_its_line_in_both_languages(tmp_path):
    path = tmp_path / "broken.csv"
    path.write_text('statement,label\n"Paris is in France.,1\nRome is in Italy.,1\n')
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    assert info.value.key == "data_open_quote" and info.value.params["line"] == 2  # the line the quote opens on
    en, zh = _in_both(info.value)
    _plain([str(info.value), en, zh])
    assert "line 2 opens a quote" in en and "第 2 行" in zh and "previously loaded data is unchanged" in en


def test_a_row_with_too_many_cells_says_how_many(tmp_path):
    path = tmp_path / "wide.tsv"
    path.write_text("statement\tlabel\nParis is in France.\t1\nRome\tis\t1\n")
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    assert (info.value.key, info.value.params) == ("data_cell_count", {"name": "wide.tsv", "kind": "TSV", "line": 3,
                                                                       "saw": 3, "expected": 2})
    _plain(_in_both(info.value))


# ------------------------------------------------------------------ JSON / JSONL
@pytest.mark.parametrize("text, key", [
    ('[{"statement": "x}]', "json_open_string"), ('[{"statement": "x" "label": 1}]', "json_missing_comma"),
    ('[{"statement" "x"}]', "json_missing_colon"), ('[{"statement": "x",}]', "json_field_name"),
    ("[{'statement': 'x'}]", "json_field_name"), ('[{"statement": }]', "json_missing_value"),
    ('[] []', "json_extra_data"), ('["a\nb"]', "json_control_character"), ('["\\q"]', "json_bad_escape"),
])
def test_json_syntax_errors_become_plain_problems(text, key):
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads(text)
    found, params = json_problem(info.value)
    assert found == key and set(params) == {"line", "column"}
    texts = [i18n.message(lang, found, name="f.json", **params) for lang in i18n.LANGS]
    _plain(texts)
    assert all(str(params["line"]) in t and str(params["column"]) in t for t in texts)


def test_a_jsonl_row_names_the_file_s_line_not_the_row_s(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"statement": "a", "label": 1}\n\n{"statement": "b", "label": 0,}\n')
    with pytest.raises(DatasetError) as info:
        load_dataset(path)
    assert info.value.key == "json_field_name" and info.value.params["line"] == 3
    _plain(_in_both(info.value))


# ------------------------------------------------------------------ vector files
def test_a_file_that_is_not_a_vector_is_refused_without_its_bytes(tmp_path):
    from steer_ui.formats import detect_format
    from steer_ui.vector import VectorError

    path = tmp_path / "notes.txt"
    path.write_text("this is not a vector\n")
    with pytest.raises(VectorError) as info:
        detect_format(path)
    assert info.value.key == "vector_unknown_format"
    _plain([str(info.value)] + _in_both(info.value))


def test_an_import_refusal_keeps_the_reader_s_own_message_or_wraps_its_detail():
    from steer_ui.messages import UserError
    from steer_ui.rooms.common import refusal
    from steer_ui.vector import VectorError, refused

    keyed = refusal(refused("vector_unreadable_gguf", name="x.gguf"), "import_failed", name="x.gguf")
    assert isinstance(keyed, UserError) and keyed.key == "vector_unreadable_gguf"
    other = refusal(VectorError("x.pt: layer 2 has NaN"), "import_failed", name="x.pt")
    assert other.key == "import_failed" and other.params == {"name": "x.pt", "detail": "x.pt: layer 2 has NaN"}


# ------------------------------------------------------------------ toasts and the redraw
def test_one_refusal_is_toasted_once_while_its_toast_is_shown():
    from steer_ui.ui.common import TOAST_SECONDS, Toasted

    toasted = Toasted()
    assert toasted.first("page", "the prompt is empty", now=100.0)
    assert not toasted.first("page", "the prompt is empty", now=100.5)  # the action's second event
    assert toasted.first("other page", "the prompt is empty", now=100.5)  # another page has its own
    assert toasted.first("page", "another refusal", now=101.0)
    assert toasted.first("page", "another refusal", now=101.0 + TOAST_SECONDS)  # that toast has gone


def test_a_refusal_whose_toast_cannot_reach_the_page_does_not_hide_the_next_one(queued_event):
    """An unqueued event's toast is dropped by gradio (no event stream to send it down): recording it as toasted
    hid the next queued event's toast of the same line (a review of the unqueued events)."""
    import gradio as gr

    from steer_ui.messages import UserError
    from steer_ui.ui.common import TOASTED, handler

    page = "a" * 16
    request = gr.Request(headers={"x-gradio-user": "app"}, session_hash=page)
    backend = SimpleNamespace(language=lambda _sid: "en")

    @handler(backend)
    def refuses(request: gr.Request):
        raise UserError("empty_prompt")

    refuses(request)  # outside any queued event, as a queue=False event runs
    line = TOASTED._last.get(page, (None,))[0]
    assert line is None  # nothing recorded for this page
    with queued_event():
        refuses(request)  # a queued event's
    assert TOASTED._last[page][0]  # now recorded: the same line again within the toast's time is not toasted
    assert not TOASTED.first(page, TOASTED._last[page][0])


class _Component:
    def __init__(self, _id):
        self._id = _id


def _backend(lang: str):
    session = SimpleNamespace(cache={})
    # a stand-in for the door: what relabel asks of it (fronts reach no room behind it, tests/unit/test_house.py)
    return SimpleNamespace(peek_session=lambda sid: session if sid == "s" else None,
                           language=lambda sid: lang if sid == "s" else "en", session_=session)


def test_a_language_switch_redraws_what_was_drawn_the_latest_drawing_winning():
    import gradio as gr

    from steer_ui.ui import relabel

    backend = _backend("en")
    status, chart, untouched = _Component(1), _Component(2), _Component(3)
    drawn = relabel.keep(backend, "s", [status, chart], lambda lang, n: (f"{lang}: {n}", f"chart {lang}"), 0.25)
    assert drawn == ("en: 0.25", "chart en")
    relabel.keep(backend, "s", [status], *relabel.text("empty_prompt"))  # a refusal, later, on the status line
    backend.language = lambda sid: "zh-CN"
    out = relabel.redraw(backend, "s", [status, chart, untouched])
    assert out[0] == i18n.message("zh-CN", "empty_prompt") and out[1] == "chart zh-CN"
    assert isinstance(out[2], type(gr.skip()))  # never drawn: left as the page shows it
    assert all(isinstance(v, type(gr.skip())) for v in relabel.redraw(backend, "nobody", [status, chart]))


def test_a_link_notice_is_english_text_with_its_key():
    from steer_ui.ui.url_state import Notice

    notice = Notice("link_vector_missing", vector="v1")
    assert "is not on this server" in notice and notice.key == "link_vector_missing"
    assert "v1" in i18n.message("zh-CN", notice.key, **notice.params)


# ------------------------------------------------------------------ vector files refused on import
def _zh_words(text: str, *allowed: str) -> set[str]:
    """The ASCII words left in a Chinese message once the names it quotes (file, vector, model) are taken out."""
    import re

    for name in allowed:
        text = text.replace(name, "")
    return set(re.findall(r"[A-Za-z][A-Za-z_]*", text))


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from steer_ui.service import Service
    from steer_ui.tiny import tiny_handle

    return Service(handle=tiny_handle("llama"), workdir=tmp_path_factory.mktemp("work"))


def _refused_import(service, path):
    from steer_ui.messages import UserError

    with pytest.raises(UserError) as info:
        service.import_vector("s", path)
    return info.value


def test_a_vector_of_another_hidden_size_is_refused_in_both_languages(service, tmp_path):
    import torch

    from steer_ui.vector import SteeringVector

    path = SteeringVector(directions={2: torch.ones(32)}, hidden_size=32, method="mean-diff",
                          name="small").save(tmp_path / "small.safetensors")
    exc = _refused_import(service, path)
    assert exc.key == "vector_hidden_size_mismatch" and "hidden size 32" in str(exc) and "64" in str(exc)
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert "32" in zh and "64" in zh and "隐藏维度" in zh
    assert _zh_words(zh, "small", service.handle.model_id) == set(), zh


def test_a_vector_for_a_layer_the_model_lacks_is_refused_in_both_languages(service, tmp_path):
    import torch

    from steer_ui.vector import SteeringVector

    last = service.handle.arch.num_layers - 1
    path = SteeringVector(directions={40: torch.ones(64)}, hidden_size=64, method="mean-diff",
                          name="deep").save(tmp_path / "deep.safetensors")
    exc = _refused_import(service, path)
    assert exc.key == "vector_layer_out_of_range" and f"layers 0..{last}" in str(exc)
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert "40" in zh and f"0 至 {last}" in zh
    assert _zh_words(zh, "deep", service.handle.model_id) == set(), zh


def test_a_vector_with_nan_is_refused_in_both_languages(service, tmp_path):
    import torch
    from safetensors.torch import save_file

    direction = torch.ones(64)
    direction[7] = float("nan")
    path = tmp_path / "nan.safetensors"
    save_file({"direction.2": direction}, str(path))
    exc = _refused_import(service, path)
    assert exc.key == "vector_layer_not_finite" and exc.params["index"] == 7
    assert str(exc) == "nan.safetensors: layer 2 has NaN or inf at index 7; the vector cannot be used"
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert "nan.safetensors" in zh and "7" in zh
    assert _zh_words(zh, "nan.safetensors") <= {"NaN", "inf"}, zh


@pytest.mark.parametrize("name, text, key", [
    ("no-vector.json", '{"layer": 2, "hookType": "hook_resid_post"}', "vector_json_no_vector"),
    ("nan.json", '{"vector": [1.0, NaN], "layer": 2}', "vector_json_not_finite"),
    ("attn.json", '{"vector": [1.0], "layer": 2, "hookType": "hook_attn_out"}', "vector_json_hook_type"),
    ("extras.json", '{"vector": ' + str([0.5] * 64) + ', "layer": 2, "steer_ui_extras": 5}', "vector_file_invalid"),
])
def test_json_vector_refusals_are_keyed(service, tmp_path, name, text, key):
    path = tmp_path / name
    path.write_text(text)
    exc = _refused_import(service, path)
    assert exc.key == key and exc.params["name"] == name
    assert str(exc).startswith(f"{name}: ")  # the English is the reader's own, as before
    assert name in i18n.message("zh-CN", exc.key, **exc.params)


def test_a_file_that_is_not_a_vector_is_refused_by_key_on_import(service, tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00\x01 not a vector")
    exc = _refused_import(service, junk)
    assert exc.key == "vector_unknown_format" and "junk.safetensors" in str(exc)
    assert _zh_words(i18n.message("zh-CN", exc.key, **exc.params), "junk.safetensors") <= {
        "safetensors", "GGUF", "steering", "vectors", "CAA", "pt", "Neuronpedia", "JSON"}


def test_steering_with_a_vector_the_model_cannot_take_is_refused_by_key(service):
    import torch

    from steer_ui.messages import UserError
    from steer_ui.steering import check_compatible
    from steer_ui.vector import SteeringVector

    handle = service.handle
    small = SteeringVector(directions={2: torch.ones(32)}, hidden_size=32, method="mean-diff", name="small")
    deep = SteeringVector(directions={40: torch.ones(64)}, hidden_size=64, method="mean-diff", name="deep")
    for vector, key in ((small, "steering_hidden_size"), (deep, "steering_layer_out_of_range")):
        with pytest.raises(ValueError) as info:
            check_compatible(handle, vector)
        assert info.value.key == key
        zh = i18n.message("zh-CN", key, **info.value.params)
        assert _zh_words(zh, "small", handle.model_id) == set(), zh
    assert "hidden size 32" in str(pytest.raises(ValueError, check_compatible, handle, small).value)
    from steer_ui.rooms.common import refusal

    wrapped = refusal(pytest.raises(ValueError, check_compatible, handle, deep).value, "steering_failed")
    assert isinstance(wrapped, UserError) and wrapped.key == "steering_layer_out_of_range"


def test_export_notes_read_in_the_page_s_language_and_in_english_for_the_cli():
    import dataclasses

    from steer_ui.formats import export_notes
    from steer_ui.methods.iti import export_note
    from steer_ui.ui.export_tab import exported_markdown
    from steer_ui.vector import random_vector

    bounded = dataclasses.replace(random_vector(16, 1, seed=3), max_delta_logit=0.2)
    notes = export_notes(bounded, "gguf")
    iti = SimpleNamespace(method="iti", hyperparameters={"residual_export": {"relative_error": 0.12, "kl": 0.0123,
                                                                             "alpha": 2.0}})
    notes.append(export_note(iti))
    assert notes[0].startswith("this vector was made to steer within a centred |Δlogit| of 0.2; ")  # the CLI's
    assert notes[1].startswith("approximate: this ITI vector steers attention heads;") and "12% differently" in notes[1]
    english = exported_markdown("en", "gguf", ["v.gguf"], notes)
    assert "steer without it" in english and "Export as native" in english
    chinese = exported_markdown("zh-CN", "gguf", ["v.gguf"], notes)
    assert "0.2" in chinese and "12%" in chinese and "α = 2" in chinese
    assert "steer without it" not in chinese and "approximate" not in chinese and "Export as native" not in chinese


def test_a_model_s_loading_line_reads_in_the_page_s_language():
    from steer_ui.messages import Said
    from steer_ui.ui.model_tab import status_markdown

    loading = {"ready": False, "error": None, "loading": True, "fraction": 0.35,
               "message": Said("progress_gguf_dequantising")}
    door = SimpleNamespace(model_status=lambda: loading)
    assert r"dequantising weights from GGUF \(slow, once\) — 35%" in status_markdown(door, "en")  # Markdown-escaped
    chinese = status_markdown(door, "zh-CN")
    assert "反量化" in chinese and "35%" in chinese and "dequantising" not in chinese


# ------------------------------------------------------------------ a failed model load
def _failed_load(tmp_path, source: str):
    """A door with no model whose load of ``source`` failed: (the refusal, the door)."""
    from steer_ui.messages import UserError
    from steer_ui.service import Service

    door = Service(handle=None, workdir=tmp_path / "work")
    with pytest.raises(UserError) as info:
        door.load_model(source)
    return info.value, door


@pytest.mark.parametrize("source, key, names", [
    ("tiny:nope", "model_error_tiny_family", ("nope", "llama", "mistral", "qwen", "gemma", "gpt", "neox", "phi",
                                              "opt")),
    ("random:huge", "model_error_random_shape", ("huge", "llama", "b", "mini")),
    ("EMPTY", "model_error_directory", ()),
])
def test_a_failed_model_load_is_kept_by_key_and_read_in_the_page_s_language(tmp_path, source, key, names):
    """The model line of a server whose load failed says why in the page's language (it kept the loader's English
    line, so 简体中文 read "无法加载模型：unknown tiny family…"); the CLI's English is the loader's own."""
    from steer_ui.ui.model_tab import status_markdown

    if source == "EMPTY":  # a folder that is no model: transformers' own words stay in the log
        source = str(tmp_path / "not-a-model")
        (tmp_path / "not-a-model").mkdir()
    exc, door = _failed_load(tmp_path, source)
    detail = door.model_status()["error"]
    assert exc.key == "model_load_failed" and detail.key == key and door.model_status()["message"].key == exc.key
    english = status_markdown(door, "en")
    assert english.startswith("The model could not be loaded: ") and str(detail).split(" ")[0] in english
    chinese = status_markdown(door, "zh-CN")
    assert chinese.startswith("无法加载模型："), chinese
    assert _zh_words(chinese.replace("\\", ""), source, *names) == set(), chinese
    if key == "model_error_directory":
        assert "tokenizer" not in english and "instantiate" not in english, english


def test_a_model_load_that_fails_in_another_library_says_so_plainly_in_both_languages(tmp_path, monkeypatch, caplog):
    """torch's or transformers' own words (here a RuntimeError) go to the log; the page says, in its language,
    that the loader failed and where its words are."""
    from steer_ui.model import loading
    from steer_ui.ui.model_tab import status_markdown

    def fails(*_a, **_k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(loading, "load_model", fails)
    exc, door = _failed_load(tmp_path, str(tmp_path))
    assert door.model_status()["error"].key == "model_error_unexpected"
    assert "illegal memory access" in caplog.text
    for lang in i18n.LANGS:
        assert "illegal" not in status_markdown(door, lang) and "CUDA" not in i18n.message(lang, exc.key, **exc.params)
    assert _zh_words(status_markdown(door, "zh-CN")) == set()


# ------------------------------------------------------------------ import warnings
# the names a warning quotes that are the same in every language: formats, fields and methods
FORMAT_WORDS = {"steering", "vectors", "layer_activations", "steer_ui", "L", "S", "MLP", "TSV", "ITI", "hookType",
                "hook_resid_pre", "hook_resid_post", "GGUF", "repeng", "controlvector", "model_hint", "layer_count",
                "json", "direction", "tiny", "llama", "pt", "gguf"}


def _imported(service, path):
    from steer_ui.ui.export_tab import imported_markdown

    name, warnings = service.import_vector("s", path)
    return warnings, imported_markdown("zh-CN", name, warnings)


def test_import_warnings_are_keyed_and_read_in_the_page_s_language(service, tmp_path):
    """A steering-vectors file without its sidecar and without a model says three things to check; each is said by
    key (the CLI's English is the reader's own, as before) and the 简体中文 page words them all in Chinese."""
    import torch

    path = tmp_path / "bare.pt"
    torch.save({2: torch.ones(64)}, path)
    warnings, chinese = _imported(service, path)
    assert [w.key for w in warnings] == ["import_warning_bare_dict", "import_warning_no_sidecar",
                                         "import_warning_no_model"]
    assert warnings[0] == ("bare.pt: a bare {layer: tensor} dict; read as steering-vectors layer_activations "
                           "(decoder block outputs)")
    assert "bare.steer_ui.json" in chinese and "张量" in chinese and "模型" in chinese
    assert _zh_words(chinese, "bare.steer_ui.json", "bare.pt", "bare") <= FORMAT_WORDS, chinese


@pytest.mark.parametrize("doc, key", [
    ({"hookName": "blocks.2.hook_resid_pre"}, "import_warning_resid_pre"),
    ({"layer": 2}, "import_warning_no_hook"),
    ({"layer": 2, "hookType": "hook_resid_post", "modelId": "x", "steer_ui": {"layers": [3], "model_type": "gpt2"}},
     "import_warning_meta_layers"),
])
def test_neuronpedia_import_warnings_are_keyed(service, tmp_path, doc, key):
    path = tmp_path / "np.json"
    path.write_text(json.dumps({"vector": [0.5] * 64, **doc}))
    warnings, chinese = _imported(service, path)
    assert key in [w.key for w in warnings]
    assert _zh_words(chinese, "np.json", "np") <= FORMAT_WORDS, chinese



# ------------------------------------------------------------------ a library's own words in a refusal
FOREIGN_WORDS = LIBRARY_WORDS + ("invalid literal", "base 10", "Incorrect padding", "Non-base64", "Unsupported global",
                                 "weights_only", "Weights only", "KeyError")


def _safetensors_file(path, header: dict, data: bytes):
    import struct

    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _gguf_with_text_layer_count(path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.layer_count", "two")  # gguf reads it; int() then fails in Python's words
    writer.add_tensor("direction.2", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _hostile(tmp_path, kind: str):
    import pathlib

    import torch

    entry = {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}
    if kind == "no dtype":
        entry.pop("dtype")
        return _safetensors_file(tmp_path / "a.safetensors", {"direction.2": entry}, bytes(256))
    if kind == "text shape":
        return _safetensors_file(tmp_path / "a.safetensors", {"direction.2": {**entry, "shape": ["x"]}}, bytes(256))
    if kind == "bad base64":
        path = tmp_path / "a.json"
        path.write_text(json.dumps({"vector": [0.5] * 64, "layer": 2,
                                    "steer_ui_extras": {"t": {"dtype": "float32", "shape": [2], "base64": "!" * 12}}}))
        return path
    if kind == "an object":
        path = tmp_path / "a.pt"
        torch.save({"layer_activations": {2: torch.ones(64)}, "x": pathlib.PurePosixPath("/")}, path)
        return path
    return _gguf_with_text_layer_count(tmp_path / "a.gguf")


@pytest.mark.parametrize("kind, key, said", [
    ("no dtype", "vector_file_invalid", "no 'dtype'"),
    ("text shape", "vector_file_invalid", "a value of the wrong kind"),
    ("bad base64", "vector_file_invalid", "not valid base64 text"),
    ("an object", "vector_torch_objects", "it asks for pathlib.PurePosixPath"),
    ("a text layer count", "import_failed", "its contents could not be read"),
])
def test_a_library_s_parse_error_in_a_refusal_is_said_in_plain_words(service, tmp_path, kind, key, said):
    """A refused file whose detail was another library's error (Python's int(), binascii, torch's unpickler, a
    value gguf read that Python could not use) says it in plain words, in English and in Chinese alike."""
    exc = _refused_import(service, _hostile(tmp_path, kind))
    assert exc.key == key and said in str(exc), str(exc)
    for text in _in_both(exc):
        assert not any(word in text for word in FOREIGN_WORDS), text
    chinese = i18n.message("zh-CN", exc.key, **exc.params)
    allowed = {"direction", "t", "dtype", "base", "pathlib", "PurePosixPath", "Python", "torch", "pickle"}  # names
    assert _zh_words(chinese, exc.params.get("name", "")) <= allowed, chinese


def test_a_library_s_own_words_go_to_the_log(caplog):
    from steer_ui.vector import file_detail

    detail = file_detail(ValueError("invalid literal for int() with base 10: 'two'"))
    assert detail.key == "vector_detail_unreadable" and "base 10" in caplog.text
    assert file_detail(ValueError("x")) == detail  # one line whatever the library said


@pytest.mark.parametrize("meta, field", [
    ({"method": "x" * 65}, "method"),
    ({"model_type": 7}, "model_type"),
    ({"positions": "everywhere"}, "positions"),
    ({"alpha_range": [2, 1]}, "alpha_range"),
    ({"max_delta_logit": 0}, "max_delta_logit"),
    ({"hyperparameters": []}, "hyperparameters"),
])
def test_hand_edited_metadata_is_refused_in_the_page_s_language(service, tmp_path, meta, field):
    """A file whose steer_ui metadata a person edited by hand: the record's own refusal is said by key, so the
    Chinese page names the field in its brackets and says the rest in Chinese."""
    path = tmp_path / "edited.json"
    path.write_text(json.dumps({"vector": [0.5] * 64, "layer": 2, "steer_ui": {"layers": [2], **meta}}))
    exc = _refused_import(service, path)
    assert exc.key == "vector_file_invalid" and exc.params["detail"].key.startswith("vector_field_")
    chinese = i18n.message("zh-CN", exc.key, **exc.params)
    assert field in chinese
    unquoted = re.sub(r"'[^']*'", "", chinese)  # the values the file holds, quoted as they are
    assert _zh_words(unquoted, "edited.json", field) <= {"int", "list", "null", "JSON", "NUL"}, chinese


# ------------------------------------------------------------------ datasets refused or read with notes (#52)
DATASET_NOTES = {"completion", "UTF", "label", "true", "false", "yes", "no", "truthful", "hallucinated", "CSV",
                 "TSV", "JSON", "JSONL", "Parquet", "Python", "pickle", "dict", "list", "int", "str"}


def _dataset_refused_on_the_page(service, path, schema=None):
    from steer_ui.messages import UserError

    with pytest.raises(UserError) as info:
        service.upload_dataset("s", str(path), schema)
    return info.value


@pytest.mark.parametrize("name, content, schema, key", [
    ("cols.csv", "foo,bar\n1,2\n", None, "dataset_no_schema"),
    ("pairs.csv", "statement,label\nParis is in France.,1\n", "pairs", "dataset_needs_column"),
    ("maybe.csv", "statement,label\nParis is in France.,maybe\n", None, "dataset_label_unreadable"),
    ("blank.csv", "statement,label\nParis is in France.,\n", None, "dataset_label_empty"),
    ("true.csv", "statement,label\nParis is in France.,1\nRome is in Italy.,1\n", None, "dataset_all_true"),
    ("header.csv", "statement,label\n", None, "dataset_no_rows"),
    ("model.pkl", "not really a pickle", None, "dataset_pickle"),
    ("cols.json", '{"statement": ["a", "b"], "label": [1]}', None, "dataset_json_unequal_columns"),
    ("number.json", "5", None, "dataset_json_not_list"),
    ("rows.jsonl", '{"statement": "a", "label": 1}\n[1]\n', None, "dataset_jsonl_line"),
    ("binary.csv", "statement,label\n\x00\x01\x02,1\n", None, "dataset_binary"),
])
def test_a_refused_dataset_is_said_in_the_page_s_language(service, tmp_path, name, content, schema, key):
    """The same file in both languages: the CLI's English is the reader's own line, "<file>: <detail>"; the page
    says "<file> could not be used: <detail>. ..." by key, and in Chinese has no English words but the file's and
    the format's names (pandas' own words, for unequal JSON columns, go nowhere near either)."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError) as info:
        load_dataset(path, schema=schema)
    assert info.value.key == "dataset_problem" and info.value.params["detail"].key == key
    assert str(info.value).startswith(f"{name}: ")
    exc = _dataset_refused_on_the_page(service, path, schema)
    assert exc.key == "dataset_invalid"
    en, zh = _in_both(exc)
    assert en.startswith(f"{name} could not be used: ") and name not in en[len(name):]
    _plain([en, zh])
    assert "same length" not in en
    found = {"foo", "bar", "statement", "maybe", "pairs", "positive", "chosen", "pos", "negative", "rejected",
             "neg"}  # what the file holds or the columns it could name, quoted as they are
    expected = "应为 " + i18n.message("zh-CN", "dataset_expected")
    longest_first = sorted(found, key=len, reverse=True)  # "pos" taken out first would leave "itive" of "positive"
    assert _zh_words(zh.replace(expected, ""), name, *longest_first) <= DATASET_NOTES, zh


def test_the_english_of_a_refused_dataset_is_the_cli_s_as_before(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("statement,label\nParis is in France.,1\n")
    with pytest.raises(DatasetError) as info:
        load_dataset(path, schema="pairs")
    assert str(info.value) == ("pairs.csv: schema 'pairs' needs a positive column (positive or chosen or pos or "
                               "positive_completion); found [statement, label]")
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert "正例列" in zh and "positive 或 chosen 或 pos 或 positive_completion" in zh


def test_dataset_warnings_are_keyed_and_read_in_the_page_s_language(service, tmp_path):
    """Dropped rows, duplicates and a UTF-16 file: the Data tab's notes in Chinese, the CLI's English as before."""
    from steer_ui.ui.data_tab import summary_markdown

    rows = "".join(f"Statement {i} is here.,{i % 2}\n" for i in range(12)) * 2  # twelve duplicates
    path = tmp_path / "notes.csv"
    path.write_bytes(("statement,label\n,1\n" + rows).encode("utf-16"))
    dataset = load_dataset(path)
    english = [str(w) for w in dataset.warnings]
    assert english == ["notes.csv: read as UTF-16 (byte-order mark found); UTF-8 is preferred",
                       "notes.csv: dropped 1 row(s) with empty text (completion): rows 1",
                       "notes.csv: dropped 12 duplicate row(s): rows 13, 14, 15, 16, 17, 18, 19, 20 and 4 more"]
    summary = service.upload_dataset("s", str(path), None)
    zh = summary_markdown("zh-CN", summary)
    assert "另有 4 行" in zh and "UTF-16" in zh and "重复行" in zh
    notes = "\n".join(line for line in zh.splitlines() if line.startswith("⚠"))  # the summary line names columns
    assert notes.count("⚠") == 3 and _zh_words(notes, "notes.csv", "completion") <= {"UTF"}, zh
    assert "dropped 12 duplicate" in summary_markdown("en", summary)


def test_truthfulqa_notes_are_keyed(tmp_path):
    path = tmp_path / "tqa.csv"
    path.write_text("Question,Correct Answers,Incorrect Answers\nWhere is Paris?,France,Spain\nWhy?,Because,\n")
    warnings = load_dataset(path).warnings
    assert [w.key for w in warnings] == ["dataset_warn_one_sided", "dataset_warn_expanded"]
    assert str(warnings[1]) == "tqa.csv: expanded 2 questions into 3 labelled answers"
    for w in warnings:
        assert _zh_words(i18n.say("zh-CN", w), "tqa.csv") == set()


# ------------------------------------------------------------------ a vector's tensors checked when it is built (#52)
def _refused_vector(**fields):
    import torch

    from steer_ui.vector import SteeringVector, VectorError

    with pytest.raises(VectorError) as info:
        SteeringVector(**{"directions": {2: torch.ones(8)}, "hidden_size": 8, **fields})
    return info.value


@pytest.mark.parametrize("fields, key, english", [
    ({"directions": {}}, "vector_no_layers", "a steering vector needs at least one layer direction"),
    ({"directions": {2: "abc"}}, "vector_tensor_not_tensor", "direction for layer 2 is a str, not a tensor"),
    ({"directions": {2: [1.0, "x"] * 4}}, "vector_tensor_not_numbers", "direction for layer 2: not a list of numbers"),
    ({"directions": {2: "int"}}, "vector_tensor_not_tensor", None),
    ({"directions": {2: [[1.0] * 8] * 2}}, "vector_direction_not_1d",
     "direction for layer 2 must be 1-D, got shape (2, 8)"),
    ({"directions": {2: [1.0] * 4}}, "vector_direction_size", "direction for layer 2 has 4 values but hidden size is 8"),
    ({"directions": {2: [float("nan")] * 8}}, "vector_direction_not_finite",
     "direction for layer 2 contains NaN or inf values"),
    ({"extras": {"a b": [1.0]}}, "vector_extra_name", None),
    ({"extras": {"w": [float("inf")]}}, "vector_extra_tensor_not_finite", "extra tensor 'w' contains NaN or inf values"),
    ({"extras": 5}, "vector_extras_not_dict", "extras must be a {name: tensor} dict, got int"),
])
def test_a_vector_s_tensor_checks_are_keyed(fields, key, english):
    exc = _refused_vector(**fields)
    assert exc.key == key
    if english:
        assert str(exc) == english
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert _zh_words(re.sub(r"'[^']*'|“[^”]*”", "", zh), "NaN", "inf") <= {"str", "extras", "name", "tensor", "int"}, zh


def test_check_tensor_s_refusals_are_keyed_with_the_tensor_named_in_the_page_s_language():
    import torch

    from steer_ui.messages import Said
    from steer_ui.vector import FLOAT_DTYPES, VectorError, check_tensor

    what = Said("vector_tensor_direction", layer=3)
    for tensor, key in ((torch.zeros(1).expand(64), "vector_tensor_overlap"),
                        (torch.zeros(8, dtype=torch.int64), "vector_tensor_dtype"),
                        (torch.zeros([1] * 9), "vector_tensor_dims"),
                        (torch.zeros(4).to_sparse(), "vector_tensor_layout")):
        with pytest.raises(VectorError) as info:
            check_tensor(tensor, what, FLOAT_DTYPES)
        assert info.value.key == key and str(info.value).startswith("direction for layer 3 ")
        zh = i18n.message("zh-CN", info.value.key, **info.value.params)
        assert zh.startswith("第 3 层的方向"), zh
        assert _zh_words(zh, "bfloat16", "float32", "float16", "float64", "int64", "torch", "sparse_coo") == set(), zh


def test_a_refused_tensor_in_an_imported_file_is_said_in_the_page_s_language(service, tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "wide.safetensors"
    save_file({"direction.2": torch.ones(2, 32)}, str(path))
    exc = _refused_import(service, path)
    en, zh = _in_both(exc)
    assert "must be 1-D" in en and "一维" in zh
    assert _zh_words(zh, "wide.safetensors") == set(), zh


# ------------------------------------------------------------------ Train / Detect refusals after a dataset is loaded (#52)
def _refused_training(service, tmp_path, name, csv, **train):
    """The same one-line refusal the Train tab shows, in both languages, for a dataset the readers accepted."""
    from steer_ui.messages import UserError

    path = tmp_path / name
    path.write_text(csv)
    service.upload_dataset("train", str(path), None)
    with pytest.raises(UserError) as info:
        (train.pop("call", None) or service.train)("train", **train)
    return info.value


def _rows(label, group, n=8) -> str:
    return "statement,label,group\n" + "".join(f"Statement {i} is here.,{label(i)},{group(i)}\n" for i in range(n))


@pytest.mark.parametrize("csv, detail_key, english", [
    (_rows(lambda i: i % 2, lambda i: "g"), "split_one_group",
     "one.csv: only one group ('g'); a split by group needs at least two"),
    (_rows(lambda i: i % 2, lambda i: f"g{i % 2}"), "split_too_few_groups",
     "one.csv: too few groups (2) for a train/test split"),
])
def test_a_dataset_that_cannot_be_split_is_refused_in_the_page_s_language(service, tmp_path, csv, detail_key,
                                                                         english):
    exc = _refused_training(service, tmp_path, "one.csv", csv, method="mean-diff")
    assert exc.key == "training_failed" and str(exc) == f"Training failed: {english}"  # the CLI's English as before
    detail = exc.params["detail"]
    assert detail.key == "dataset_problem" and detail.params["detail"].key == detail_key
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert zh.startswith("训练失败：one.csv：") and _zh_words(zh, "one.csv") <= {"g"}, zh


def test_a_test_split_of_one_class_is_refused_in_the_page_s_language(service, tmp_path):
    """Three groups, one of them false: the held-out split is one true group, so probing every layer is refused."""
    csv = _rows(lambda i: int(i % 3 == 0), lambda i: f"g{i % 3}", n=9)
    exc = _refused_training(service, tmp_path, "three.csv", csv, call=service.probe_layers)
    assert exc.params["detail"].key == "method_single_class"
    assert "the test split has a single class; a probe needs true and false rows" in str(exc)
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert "测试集只有一个类别" in zh and _zh_words(zh) == set(), zh


@pytest.mark.parametrize("method, settings, detail_key, english", [
    ("mean-diff", {"layer": 99}, "method_layer_missing", "layer 99 does not exist: the model has layers 0..3"),
    ("tsv", {"layer": 99}, "method_layer_missing", "layer 99 does not exist: the model has layers 0..3"),
    ("mean-diff", {"template": "no slot"}, "activations_template",
     "the template must contain '{completion}' exactly once, got 'no slot'"),
])
def test_a_bad_layer_or_template_is_refused_in_the_page_s_language(service, tmp_path, method, settings, detail_key,
                                                                  english):
    csv = _rows(lambda i: i % 2, lambda i: f"g{i % 4}", n=16)
    exc = _refused_training(service, tmp_path, "ok.csv", csv, method=method, settings=settings)
    assert exc.params["detail"].key == detail_key and str(exc) == f"Training failed: {english}"
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert _zh_words(zh, "no slot", "completion") == set(), zh


def test_a_position_the_reader_cannot_take_is_keyed():
    from steer_ui.data.activations import _check_position

    with pytest.raises(DatasetError) as info:
        _check_position("middle")
    assert str(info.value) == "position must be 'last', 'mean' or a token index, got 'middle'"
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert _zh_words(zh, "'last'", "'mean'", "'middle'") == set(), zh


def test_tsv_refusals_are_keyed_and_said_in_the_page_s_language(service, tmp_path):
    """A one-class TSV training set, an empty answer to score and a vector that is not a TSV: each in Chinese."""
    import torch

    from steer_ui.methods.tsv.data import TSVError, rows_of
    from steer_ui.methods.tsv.scoring import check_vector
    from steer_ui.vector import SteeringVector, VectorError

    with pytest.raises(TSVError) as info:
        rows_of([("Q?", "yes", 1), ("Q?", "", 0)])
    assert str(info.value) == "row 1: empty answer" and info.value.key == "tsv_empty_answer"
    not_tsv = SteeringVector(directions={1: torch.ones(64)}, hidden_size=64, method="mean-diff", name="plain")
    with pytest.raises(VectorError) as info:
        check_vector(service.handle, not_tsv)
    assert str(info.value).startswith("'plain' is not a TSV vector (method=mean-diff, extras=[])")
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert _zh_words(zh, "plain", "mean-diff", "TSV") == set(), zh
    with pytest.raises(TSVError) as info:
        rows_of([("Q?", "yes", "maybe")])
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert "maybe" in zh and _zh_words(zh, "maybe") <= {"true", "false", "yes", "no"}, zh


def test_l2s_refusals_are_keyed_and_said_in_the_page_s_language(service, tmp_path):
    """Pairs from two prompts only: L2S needs three groups; and a pair the reader cannot take, in both languages."""
    from steer_ui.methods.l2s.pairs import L2SError, as_pairs

    csv = "prompt,positive,negative\n" + "".join(f"Prompt {i % 2}?,Yes {i},No {i}\n" for i in range(6))
    exc = _refused_training(service, tmp_path, "pairs.csv", csv, method="l2s")
    assert exc.params["detail"].key == "l2s_groups"
    assert str(exc) == "Training failed: L2S needs at least 3 groups (train, validation, held-out test); found 2"
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert "至少需要 3 个分组" in zh and _zh_words(zh, "L2S") == set(), zh  # L2S: the method's name
    with pytest.raises(L2SError) as info:
        as_pairs([("Prompt?", " same", " same")])
    assert str(info.value) == "pair 1: positive and negative completions are identical (' same')"
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert _zh_words(zh, "same") == set(), zh


def test_an_l2s_layer_the_model_lacks_names_which_layer_in_the_page_s_language(service):
    from steer_ui.methods.l2s.activations import check_layer
    from steer_ui.methods.l2s.pairs import L2SError

    with pytest.raises(L2SError) as info:
        check_layer(service.handle, 9, "context layer")
    assert str(info.value) == "context layer 9 does not exist: the model has layers 0..3"
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert zh.startswith("上下文层 9 不存在") and _zh_words(zh) == set(), zh


# ------------------------------------------------------------------ export refusals (#52)
def _refused_export(service, tmp_path, directions: dict, fmt: str):
    import torch

    from steer_ui.messages import UserError
    from steer_ui.vector import SteeringVector

    path = SteeringVector(directions={layer: torch.ones(64) for layer in directions}, hidden_size=64,
                          method="mean-diff", name="two").save(tmp_path / f"{fmt}.safetensors")
    name, _ = service.import_vector("export", path, name=f"v-{fmt}")
    with pytest.raises(UserError) as info:
        service.export_vector("export", name, fmt)
    return info.value


@pytest.mark.parametrize("layers, fmt, detail_key, english", [
    ((1, 2), "neuronpedia", "export_neuronpedia_layers", "a Neuronpedia vector has one layer but this vector has "
                                                         "layers [1, 2]; export it as gguf, steering-vectors or caa"),
    ((0,), "gguf", "export_gguf_layer_0", "cannot export a layer-0 vector as a GGUF control vector"),
])
def test_an_export_a_format_cannot_hold_is_refused_in_the_page_s_language(service, tmp_path, layers, fmt,
                                                                          detail_key, english):
    exc = _refused_export(service, tmp_path, dict.fromkeys(layers), fmt)
    assert exc.key == "export_failed" and exc.params["detail"].key == detail_key and english in str(exc)
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert _zh_words(zh, fmt) <= {"Neuronpedia", "gguf", "steering", "vectors", "caa", "GGUF", "llama", "cpp",
                             "direction"}, zh


def test_the_writers_own_export_refusals_are_keyed(tmp_path):
    import torch

    from steer_ui.formats import export_path, write_vector
    from steer_ui.vector import SteeringVector, VectorError

    vector = SteeringVector(directions={1: torch.ones(8)}, hidden_size=8, method="mean-diff", name="v")
    for call in (lambda: write_vector(vector, "onnx", tmp_path / "v"), lambda: export_path(tmp_path, "v", "onnx")):
        with pytest.raises(VectorError) as info:
            call()
        assert str(info.value).startswith("unknown export format 'onnx' (choose from native, gguf")
        zh = i18n.message("zh-CN", info.value.key, **info.value.params)
        assert _zh_words(zh, "onnx") <= {"native", "gguf", "steering", "vectors", "neuronpedia", "caa"}, zh
    with pytest.raises(VectorError) as info:
        write_vector(vector, "caa", tmp_path / "v.pt")
    assert info.value.key == "export_caa_directory" and "not v.pt" in str(info.value)
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert _zh_words(zh, "v.pt", "vec_layer_<L>.pt") == {"caa"}, zh


# ------------------------------------------------------------------ Train settings refused (#52)
@pytest.mark.parametrize("method, settings, detail_key, english, names", [
    ("mean-diff", {"position": "middle"}, "setting_choice", "position must be one of last, mean, got 'middle'",
     ("position", "last", "mean", "middle")),
    ("tsv", {"lam": 0}, "setting_not_positive", "lam must be > 0, got 0.0", ("lam",)),
    ("tsv", {"epochs": "abc"}, "setting_not_a_number", "init_epochs must be a number, got 'abc'",
     ("init_epochs", "abc")),
    ("l2s", {"lr": 0}, "setting_not_positive", "lr must be > 0, got 0.0", ("lr",)),
    ("mean-diff", {"nope": 1}, "setting_unknown", "unknown setting(s) nope; known: kl_bound, layer",
     ("nope", "kl_bound", "layer", "normalize", "position", "seed", "template", "test_fraction")),
])
def test_a_refused_setting_is_said_in_the_page_s_language(service, tmp_path, method, settings, detail_key, english,
                                                          names):
    """The settings' own names stay as written (the CLI's flags and the API's fields); the rest is Chinese."""
    csv = _rows(lambda i: i % 2, lambda i: f"g{i % 4}", n=16)
    exc = _refused_training(service, tmp_path, "ok.csv", csv, method=method, settings=settings)
    assert exc.key == "bad_settings" and exc.params["detail"].key == detail_key
    assert str(exc).startswith(f"Settings refused: {english}")
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert _zh_words(zh, *names) == set(), zh


# ------------------------------------------------------------------ ITI / L2S vectors the model cannot take (#52)
def test_an_iti_vector_whose_heads_do_not_fit_is_refused_in_the_page_s_language(service, tmp_path):
    import torch

    from steer_ui.model.capture import head_geometry
    from steer_ui.vector import SteeringVector

    num_heads, head_dim = head_geometry(service.handle)
    vector = SteeringVector(directions={1: torch.ones(64)}, hidden_size=64, method="iti", name="heads",
                            extras={"iti.heads": torch.tensor([[9, 0]]), "iti.shifts": torch.ones(1, head_dim)},
                            hyperparameters={"num_heads": num_heads})
    exc = _refused_import(service, vector.save(tmp_path / "heads.safetensors"))
    assert exc.params["detail"].key == "iti_heads_layer"
    assert str(exc) == "heads.safetensors: 'iti.heads' names layer 9; the loaded model has layers 0..3"
    zh = i18n.message("zh-CN", exc.key, **exc.params)
    assert "第 9 层" in zh and _zh_words(zh, "heads.safetensors", "iti.heads") == set(), zh


def test_l2s_steering_refusals_are_keyed():
    from steer_ui.methods.l2s.steering import check_positions
    from steer_ui.model.hooks import SteeringError

    with pytest.raises(SteeringError) as info:
        check_positions(1, 3, "all")
    assert str(info.value) == ("context layer 3 comes after steered layer 1: steering prompt positions needs the "
                               "context first; use positions='generated' or a context layer <= 1")
    zh = i18n.message("zh-CN", info.value.key, **info.value.params)
    assert _zh_words(zh, "positions='generated'") == set(), zh


def test_steering_refusals_are_said_in_the_page_s_language(service):
    """A multi-layer vector moved to a layer it lacks, and a layer the model lacks, reach Explore's line as a key
    (the explore room says an error by its key): no English inside the Chinese line."""
    import torch

    from steer_ui.messages import said_of
    from steer_ui.methods.base import static_steers
    from steer_ui.model.hooks import Steer, validate
    from steer_ui.vector import SteeringVector

    two = SteeringVector(directions={1: torch.ones(64), 3: torch.ones(64)}, hidden_size=64, method="mean-diff",
                         name="two-layers")
    picked = pytest.raises(ValueError, static_steers, service.handle, two, 0.1, layer=2).value
    missing = pytest.raises(ValueError, validate, [Steer(layer=9, vector=torch.ones(64), alpha=1.0)], 4, 64).value
    assert str(picked) == "this vector has directions for layers [1, 3]; pick one of them"
    assert str(missing) == "layer 9 does not exist: the model has layers 0..3"
    for exc, key in ((picked, "steering_pick_vector_layer"), (missing, "steering_no_such_layer")):
        assert said_of(exc).key == key
        zh = i18n.message("zh-CN", exc.key, **exc.params)
        assert _zh_words(zh) == set() and "9" in zh or "1, 3" in zh, zh
