"""Service on a tiny random model: sessions, explore calls, errors that keep state, export/import."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from steer_ui.model.units import relative_scale
from steer_ui.service import RANDOM, Service, UserError
from steer_ui.model.hooks import hook_count
from steer_ui.vector import SteeringVector, random_vector

PROMPT = "The cat sat on the"


@pytest.fixture()
def backend(tiny, tmp_path):
    return Service(handle=tiny("llama"), workdir=tmp_path)


def test_alpha_zero_changes_nothing_and_alpha_moves_the_distribution(backend):
    view0 = backend.next_token("s", PROMPT, RANDOM, 1, 0.0, relative=True)
    assert view0.kl == pytest.approx(0.0, abs=1e-6)
    assert list(view0.unsteered.token_id) == list(view0.steered.token_id)
    view = backend.next_token("s", PROMPT, RANDOM, 1, 4.0, relative=True)
    assert view.kl > 1e-4
    assert view.max_abs_delta_logit > view0.max_abs_delta_logit


def test_relative_alpha_is_a_fraction_of_the_layer_norm(backend):
    handle = backend.handle
    steer = backend.steers("s", RANDOM, 2, 0.5, relative=True)[0]
    assert float(steer.alpha) == pytest.approx(0.5 * relative_scale(handle, 2), rel=1e-5)
    assert float(steer.vector.norm()) == pytest.approx(1.0, rel=1e-5)
    raw = backend.steers("s", RANDOM, 2, 0.5, relative=False)[0]
    assert float(raw.alpha) == pytest.approx(0.5)


def test_bad_inputs_are_plain_user_errors(backend):
    with pytest.raises(UserError, match="Layer 9 does not exist"):
        backend.next_token("s", PROMPT, RANDOM, 9, 1.0)
    with pytest.raises(UserError, match="prompt is empty"):
        backend.next_token("s", "   ", RANDOM, 1, 1.0)
    with pytest.raises(UserError, match="finite"):
        backend.next_token("s", PROMPT, RANDOM, 1, float("nan"))
    with pytest.raises(UserError, match="no vector named 'nope'"):
        backend.next_token("s", PROMPT, "nope", 1, 1.0)
    with pytest.raises(UserError, match="top-p"):
        backend.sampling(top_p=0.0)
    assert hook_count(backend.handle) == 0


def test_generation_streams_and_alpha_zero_gives_identical_sides(backend):
    sampling = backend.sampling(max_new_tokens=6)
    frames = list(backend.stream_generate("s", PROMPT, RANDOM, 1, 0.0, sampling=sampling))
    final = frames[-1]
    assert final.done and len(frames) >= 2
    assert final.unsteered_text == final.steered_text
    assert all(t.delta_logit == pytest.approx(0.0, abs=1e-5) for t in final.steered_tokens)
    assert backend.session("s").last_generation["steered"]["text"] == final.steered_text
    steered = backend.generate("s", PROMPT, RANDOM, 1, 8.0, sampling=sampling)
    assert steered.steered_text != steered.unsteered_text
    frame = steered.token_frame()
    assert list(frame.columns) == ["position", "token", "logprob", "delta_logit", "direct_delta_logit",
                                   "alternatives"]


def test_abandoned_stream_frees_its_rows_and_hooks(backend):
    stream = backend.stream_generate("s", PROMPT, RANDOM, 1, 1.0, sampling=backend.sampling(max_new_tokens=200))
    next(stream)
    assert backend.engine().load["running"] == 1
    stream.close()  # the browser went away mid-generation
    deadline = time.monotonic() + 20
    while backend.engine().load["running"] and time.monotonic() < deadline:
        time.sleep(0.01)
    load = backend.engine().load
    assert (load["running"], load["waiting"]) == (0, 0)
    # the path the batch took, and why, as the app's /load and Model facts say (#20): dynamic on a CPU
    assert load["decode"]["path"] == "dynamic" and "cpu" in load["decode"]["reason"]
    assert backend.model_facts()["decode"] == {"path": "dynamic", "reason": load["decode"]["reason"]}
    time.sleep(0.2)  # the engine finishes the step it was in, then sleeps with no hooks installed
    assert hook_count(backend.handle) == 0
    assert backend.engine().stats.steps < 100  # it stopped long before its 200 tokens


def test_sessions_do_not_share_vectors_and_names_are_unique(backend):
    v = random_vector(64, 1, seed=3)
    name = backend.add_vector("a", v, "mine")
    assert backend.add_vector("a", random_vector(64, 1, seed=4), "mine") == "mine (2)"
    assert backend.vector_names("a") == [RANDOM, "mine", "mine (2)"]
    assert backend.vector_names("b") == [RANDOM]
    with pytest.raises(UserError):
        backend.get_vector("b", name)


def test_vector_layer_follows_the_slider_for_single_layer_vectors(backend):
    backend.add_vector("s", random_vector(64, 3, seed=1), "v3")
    assert backend.steers("s", "v3", 1, 1.0, relative=False)[0].layer == 1
    two = SteeringVector(directions={1: torch.ones(64), 3: torch.ones(64)}, hidden_size=64, method="mean-diff")
    backend.add_vector("s", two, "two")
    assert sorted(s.layer for s in backend.steers("s", "two", 0, 1.0, relative=False)) == [1, 3]


def test_sweep_grid_is_symmetric_and_centre_is_unsteered(backend):
    frame = backend.sweep("s", PROMPT, RANDOM, 1, alpha_max=2.0, points=5, target="e")
    assert list(frame.alpha) == [-2.0, -1.0, 0.0, 1.0, 2.0]
    assert frame.kl[2] == pytest.approx(0.0, abs=1e-6)
    assert frame.kl[4] > 0 and "target_prob" in frame
    # the sweep's α = 2 row equals a next-token call at α = 2
    view = backend.next_token("s", PROMPT, RANDOM, 1, 2.0)
    assert frame.kl[4] == pytest.approx(view.kl, rel=1e-3, abs=1e-6)


def test_export_import_round_trip_and_bad_vectors(backend, tmp_path):
    handle = backend.handle
    backend.add_vector("s", random_vector(64, 2, seed=5, model_id=handle.model_id, model_type=handle.model_type), "five")
    files = backend.export_vector("s", "five", "native")
    assert len(files) == 1 and files[0].suffix == ".safetensors"
    name, warnings = backend.import_vector("t", files[0])
    assert name in backend.vector_names("t") and warnings == []
    assert torch.equal(backend.get_vector("t", name).direction(), backend.get_vector("s", "five").direction())
    gguf = backend.export_vector("s", "five", "gguf")
    assert gguf[0].suffix == ".gguf"
    # wrong hidden size: refused, nothing added
    wrong = SteeringVector(directions={2: torch.ones(32)}, hidden_size=32, method="mean-diff")
    path = wrong.save(tmp_path / "wrong.safetensors")
    before = backend.vector_names("t")
    with pytest.raises(UserError, match="32"):
        backend.import_vector("t", path)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00\x01 not a vector")
    with pytest.raises(UserError, match="junk.safetensors"):
        backend.import_vector("t", junk)
    assert backend.vector_names("t") == before
    with pytest.raises(UserError, match="Unknown format"):
        backend.export_vector("s", "five", "docx")


def test_a_bad_dataset_leaves_the_loaded_one_in_place(backend, tmp_path):
    summary = backend.upload_dataset("s", None, bundled="capitals_statements.csv")
    assert summary["rows"] > 100 and summary["kind"] == "statements"
    for name, content in [("empty.csv", b""), ("cols.csv", b"foo,bar\n1,2\n"), ("bin.csv", bytes(range(256)) * 4),
                          ("one.csv", b"statement,label\nA is B,true\nC is D,true\n")]:
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(UserError, match=name.replace(".", r"\.")):
            backend.upload_dataset("s", bad)
        assert backend.dataset_summary("s")["rows"] == summary["rows"]
    balance = backend.class_balance("s")
    assert set(balance.columns) >= {"label", "count"} and balance["count"].sum() == summary["rows"]
    assert len(backend.dataset_preview("s", rows=5)) == 5


def test_upload_size_limit(tiny, tmp_path):
    small = Service(handle=tiny("llama"), max_file_bytes=100, workdir=tmp_path)
    big = tmp_path / "big.csv"
    big.write_text("statement,label\n" + "x is y,true\n" * 50)
    with pytest.raises(UserError, match="over the 0 MB limit|big.csv is"):
        small.upload_dataset("s", big)


def test_no_model_yet_is_a_plain_message(tmp_path):
    with pytest.raises(UserError, match="No model is loaded"):
        Service(workdir=tmp_path).next_token("s", PROMPT, RANDOM, 0, 0.0)


def test_load_tiny_model_and_unknown_family(tmp_path):
    backend = Service(workdir=tmp_path)
    facts = backend.load_model("tiny:gpt2")
    assert facts["num_layers"] == 4 and facts["hidden_size"] == 64
    assert len(backend.layer_norm_frame()) == 4
    with pytest.raises(UserError, match="could not be loaded"):
        backend.load_model("tiny:nosuchfamily")
    assert backend.model_ready  # the previous model stays usable


def test_tsv_bound_sweep_from_the_train_form_and_a_bad_bound_keeps_the_session(backend):
    backend.upload_dataset("s", None, bundled="capitals_statements.csv")
    name, report = backend.train("s", "tsv", 1, settings={"epochs": 1, "exemplars": 8, "max_rows": 48,
                                                          "bound_sweep": [0.5]})
    assert [row["bound"] for row in report["bound_sweep"]] == [0.5, 2.0, None]
    assert "constrained, bound 0.5" in report["runs"]
    names = backend.vector_names("s")
    with pytest.raises(UserError, match="bound_sweep must be a number, got 'six'"):
        backend.train("s", "tsv", 1, settings={"epochs": 1, "bound_sweep": ["six"]})
    assert backend.vector_names("s") == names and name in names
    assert backend.dataset_summary("s")["rows"] > 100


def test_one_session_cannot_take_every_place_in_the_decode_batch(backend):
    long = backend.sampling(max_new_tokens=200)
    first = backend.stream_generate("greedy", PROMPT, RANDOM, 1, 1.0, sampling=long)
    second = backend.stream_generate("greedy", PROMPT, RANDOM, 1, 2.0, sampling=long)
    next(first), next(second)
    with pytest.raises(UserError, match="already has 2 generations running"):
        next(backend.stream_generate("greedy", PROMPT, RANDOM, 1, 3.0, sampling=long))
    other = backend.generate("someone else", PROMPT, RANDOM, 1, 1.0, sampling=backend.sampling(max_new_tokens=3))
    assert other.done and other.steps == 3
    first.close(), second.close()
    assert next(backend.stream_generate("greedy", PROMPT, RANDOM, 1, 3.0, sampling=long)) is not None


def test_the_loading_banner_says_how_far_the_load_is():
    """Issue #36: while a model loads, the banner carries a percentage (the page works meanwhile)."""
    from steer_ui.ui.model_tab import status_markdown

    service = Service()
    seen = []
    service.load_model("random:llama-mini", progress=lambda f, m="": seen.append(status_markdown(service, "en")))
    assert any("%" in text and "oad" in text for text in seen), seen
    assert service.model_status()["fraction"] == 1.0 and service.model_status()["ready"]
