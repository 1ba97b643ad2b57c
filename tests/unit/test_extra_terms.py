"""Explore's added vectors (issue #48, ui/extra_terms.py): the rows' text, the spec it makes with the main row, the
link's ``steer=`` and its checks, and on a tiny model the exact arithmetic the page relies on."""
from __future__ import annotations

import json

import pytest

from steer_ui.messages import UserError
from steer_ui.service import RANDOM, Service
from steer_ui.ui import compare_tab, extra_terms
from steer_ui.ui.url_state import ExploreState, from_query

SESSION = "rows-aaaaaaaaaaaaaaaa"
PROMPT = "The weather today is"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from steer_ui.tiny import tiny_handle

    return Service(handle=tiny_handle("llama"), workdir=tmp_path_factory.mktemp("rows"))


def test_the_rows_shown_become_the_added_terms_and_none_is_today_s_one_vector():
    rows = [(RANDOM, 2, 0.5), ("positive", 1.0, -0.25), (RANDOM, 0, 9.0)]
    assert extra_terms.compose(0, rows) == ""
    text = extra_terms.compose(2, rows)  # the third row is hidden: not a term
    assert json.loads(text) == {"vectors": [{"source": "random", "scale": 0.5, "layers": [2]},
                                            {"source": "positive", "scale": -0.25, "layers": [1]}]}
    assert extra_terms.full_spec(RANDOM, 3, 0.1, True, 4, "") is None
    spec = extra_terms.full_spec("v", 3, 0.1, False, 4, text)
    assert [(t.source, t.scale, t.layers, t.normalize, t.seed) for t in spec.terms] == [
        ("v", 0.1, (3,), False, 4), ("random", 0.5, (2,), False, 4), ("positive", -0.25, (1,), False, 4)]
    assert extra_terms.shown("7") == extra_terms.EXTRA_ROWS and extra_terms.shown("nan") == 0


@pytest.mark.parametrize("extra", ["{", '{"vectors": []}', "x" * 5000, '{"vectors": [{"source": "a"}]}',
                                   json.dumps({"vectors": [{"source": "random", "scale": 1}] * 8}), 5])
def test_any_caller_s_added_terms_are_checked_as_every_spec_is(extra):
    with pytest.raises(UserError):
        extra_terms.full_spec(RANDOM, 1, 0.1, True, 0, extra)


def test_the_readout_names_the_one_term_that_moved():
    before = extra_terms.terms_of(RANDOM, 1, 0.5, extra_terms.compose(1, [("v", 2, 0.1)]))
    after = extra_terms.terms_of(RANDOM, 1, 0.5, extra_terms.compose(1, [("v", 2, 0.3)]))
    assert extra_terms.moved(before, after) == 2 and after[1] == ("v", 2, 0.3)
    assert extra_terms.moved(None, after) is None and extra_terms.moved(after, after) is None


def test_a_link_restores_the_added_terms_it_may_and_says_what_it_left_out():
    defaults = ExploreState(prompt="p", vector="v", layer=2, alpha=0.1, alpha_max=0.5)
    steer = json.dumps({"vectors": [{"source": "random", "scale": 2.0, "layers": [1]},
                                    {"source": "someone's <b>secret</b>", "scale": 1, "layers": [1]},
                                    {"source": "v", "scale": -0.2, "layers": [99]}]})
    state = from_query({"steer": steer}, defaults, ["v", RANDOM], 4, 4000)
    assert json.loads(state.extra) == {"vectors": [{"source": "random", "scale": 2.0, "layers": [1]}]}
    assert [n.key for n in state.notices] == ["link_vector_missing", "link_layer_missing"]
    assert state.alpha_max == 2.0  # every α on the page's one range
    for bad in ("not json", "{" * 5000, json.dumps({"vectors": [{"source": "v", "scale": 1}] * 4})):
        state = from_query({"steer": bad}, defaults, ["v"], 4, 4000)
        assert state.extra == "" and [n.key for n in state.notices] == ["link_steer_bad"]
    assert from_query({}, defaults, ["v"], 4, 4000).extra == ""  # a one-vector link is what it always was


def _generation(service, prompt, vector, layer, alpha, extra):
    spec = extra_terms.full_spec(vector, layer, alpha, True, 0, extra)
    sampling = service.sampling(max_new_tokens=10, greedy=True)
    frames = service.stream_generate(SESSION, prompt, vector, layer, alpha, True, 0, sampling) if spec is None \
        else service.stream_generate_for(SESSION, prompt, spec, sampling)
    return list(frames)[-1]


def _probs(view) -> dict:
    return dict(zip(view.steered["token"], view.steered["prob"]))


def _view(service, vector, layer, alpha, extra):
    spec = extra_terms.full_spec(vector, layer, alpha, True, 0, extra)
    return service.next_token(SESSION, PROMPT, vector, layer, alpha, True, 0) if spec is None \
        else service.next_token_for(SESSION, PROMPT, spec)


def test_an_added_row_of_the_main_vector_at_its_layer_adds_its_alpha(service):
    """The page's two rows v@a and v@b at one layer are the one row v@(a+b): probabilities within 1e-5, the same
    greedy text."""
    a, b = 3.0, 5.0
    both = extra_terms.compose(1, [(RANDOM, 2, b)])
    two, one = _view(service, RANDOM, 2, a, both), _view(service, RANDOM, 2, a + b, "")
    assert one.kl > 1e-3  # it steers
    p2, p1 = _probs(two), _probs(one)
    assert p2.keys() == p1.keys() and all(abs(p2[k] - p1[k]) <= 1e-5 for k in p1)
    g2, g1 = _generation(service, PROMPT, RANDOM, 2, a, both), _generation(service, PROMPT, RANDOM, 2, a + b, "")
    assert g2.steered_text == g1.steered_text and g2.unsteered_text == g1.unsteered_text


def test_an_added_row_at_alpha_zero_is_no_row(service):
    zero = extra_terms.compose(1, [(RANDOM, 1, 0.0)])
    with_row, without = _view(service, RANDOM, 2, 4.0, zero), _view(service, RANDOM, 2, 4.0, "")
    p2, p1 = _probs(with_row), _probs(without)
    assert p2.keys() == p1.keys() and all(abs(p2[k] - p1[k]) <= 1e-5 for k in p1)
    g2, g1 = _generation(service, PROMPT, RANDOM, 2, 4.0, zero), _generation(service, PROMPT, RANDOM, 2, 4.0, "")
    assert g2.steered_text == g1.steered_text


def test_the_dose_response_sweeps_the_main_vector_with_the_added_ones_held(service):
    """Each α of the sweep is the main vector at that α beside the added terms at theirs: with an added row of the
    same vector at the same layer at α b, the sweep's point α = a is the one vector at a + b."""
    a, b = 2.0, 3.0
    held = extra_terms.held(True, 0, extra_terms.compose(1, [(RANDOM, 2, b)]))
    frame = service.sweep(SESSION, PROMPT, RANDOM, 2, relative=True, seed=0, alphas=[-a, a], held=held)
    for alpha, kl in zip(frame["alpha"], frame["kl"]):
        assert kl == pytest.approx(_view(service, RANDOM, 2, alpha + b, "").kl, abs=1e-5)
    alone = service.sweep(SESSION, PROMPT, RANDOM, 2, relative=True, seed=0, alphas=[a])
    assert alone["kl"][0] == pytest.approx(_view(service, RANDOM, 2, a, "").kl, abs=1e-5)
    # an added term at a lower block than the swept one still acts (the prefix is cached below both)
    low = extra_terms.held(True, 0, extra_terms.compose(1, [(RANDOM, 0, b)]))
    lower = service.sweep(SESSION, PROMPT, RANDOM, 2, relative=True, seed=0, alphas=[a], held=low)
    both = service.next_token_for(SESSION, PROMPT, extra_terms.full_spec(RANDOM, 2, a, True, 0,
                                                                        extra_terms.compose(1, [(RANDOM, 0, b)])))
    assert lower["kl"][0] == pytest.approx(both.kl, abs=1e-5)


def test_many_prompts_steer_with_the_added_vectors_too(service):
    """Many prompts with an added row of the main vector at its layer (α b beside α a) is the one vector at a + b."""
    a, b = 2.0, 3.0
    prompts = "The weather today is\nMy favourite food is"
    sampling = service.sampling(max_new_tokens=6, greedy=True)
    held = extra_terms.held(True, 0, extra_terms.compose(1, [(RANDOM, 2, b)]))
    two = service.compare(SESSION, prompts, False, RANDOM, 2, a, True, 0, 4.0, sampling=sampling, held=held)
    from steer_ui.rooms.library import LAST_COMPARISON

    kept = service.session(SESSION).cache[LAST_COMPARISON]["settings"]["held"]  # what Save result keeps
    assert [(t["source"], t["scale"], t["layers"]) for t in kept["vectors"]] == [("random", b, [2])]
    one = service.compare(SESSION, prompts, False, RANDOM, 2, a + b, True, 0, 4.0, sampling=sampling)
    assert [r["steered"] for r in two["rows"]] == [r["steered"] for r in one["rows"]]
    assert [r["kl"] for r in two["rows"]] == pytest.approx([r["kl"] for r in one["rows"]], abs=1e-5)
    alone = service.compare(SESSION, prompts, False, RANDOM, 2, a, True, 0, 4.0, sampling=sampling)
    assert [r["kl"] for r in alone["rows"]] != pytest.approx([r["kl"] for r in one["rows"]], abs=1e-5)


def test_many_prompts_margins_sweep_the_main_vector_with_the_added_ones_held(service):
    """With pairs, the margin at each α of the grid is the main vector at that α beside the added terms at theirs:
    an added row of the main vector at its layer at α b shifts the curve by b."""
    b = 0.5
    service.upload_dataset(SESSION, None, bundled="sentiment_pairs.csv")
    sampling = service.sampling(max_new_tokens=2)
    held = extra_terms.held(True, 0, extra_terms.compose(1, [(RANDOM, 2, b)]))
    two = service.compare(SESSION, "", True, RANDOM, 2, 0.25, True, 0, 1.0, sampling=sampling,
                          alphas=[-1.0, 0.0, 1.0], held=held)
    one = service.compare(SESSION, "", True, RANDOM, 2, 0.25 + b, True, 0, 1.0 + b, sampling=sampling,
                          alphas=[-1.0 + b, b, 1.0 + b])
    assert two["rows"] and all("margins" in r for r in two["rows"])
    for with_row, shifted in zip(two["rows"], one["rows"]):
        assert with_row["margins"] == pytest.approx(shifted["margins"], abs=1e-4)


def test_a_raw_added_row_beside_a_relative_main_row_gives_the_spec_it_shows(service):
    """Each added row has its own units and seed (issue #48): the rows a link restores show them, the text they
    compose says them, the spec steers with them, and a raw row is the one-vector raw request at its α."""
    from steer_ui.ui.explore_tab import rows_view

    extra = extra_terms.compose(1, [(RANDOM, 1, 0.75, False, 7)])
    assert json.loads(extra) == {"vectors": [{"source": "random", "scale": 0.75, "layers": [1], "normalize": False,
                                              "seed": 7}]}
    spec = extra_terms.full_spec(RANDOM, 2, 0.1, True, 3, extra)
    assert [(t.scale, t.layers, t.normalize, t.seed) for t in spec.terms] == [(0.1, (2,), True, 3),
                                                                             (0.75, (1,), False, 7)]
    shown = rows_view(extra, [RANDOM], 4, 1.0, False, True, 3)  # a page opened with it: the row as composed
    rows = extra_terms.EXTRA_ROWS
    relatives, seeds, text = shown[3 + 4 * rows:3 + 5 * rows], shown[3 + 5 * rows:3 + 6 * rows], shown[-1]
    assert relatives[0] is False and seeds[0] == 7 and text == extra
    # a term written without units (a link made before rows had their own) takes the main row's, as it did then
    old = json.dumps({"vectors": [{"source": "random", "scale": 0.75, "layers": [1]}]})
    assert [(t.normalize, t.seed) for t in extra_terms.full_spec(RANDOM, 2, 0.1, False, 3, old).terms] == \
        [(False, 3), (False, 3)]
    assert rows_view(old, [RANDOM], 4, 1.0, False, False, 3)[3 + 4 * rows] is False
    # the raw row steers as the raw one-vector request does (the main row at α 0 is no steering)
    raw_row = service.next_token_for(SESSION, PROMPT, extra_terms.full_spec(RANDOM, 2, 0.0, True, 0, extra))
    alone = service.next_token(SESSION, PROMPT, RANDOM, 1, 0.75, False, 7)
    relative_row = service.next_token(SESSION, PROMPT, RANDOM, 1, 0.75, True, 7)
    assert raw_row.kl == pytest.approx(alone.kl, abs=1e-6) and raw_row.kl != pytest.approx(relative_row.kl)


def test_a_link_keeps_each_added_row_s_own_units():
    defaults = ExploreState(prompt="p", vector="v", layer=2, alpha=0.1, alpha_max=0.5)
    steer = extra_terms.compose(2, [(RANDOM, 1, 0.2, False, 5), ("v", 3, -0.1, True, 9)])
    state = from_query({"steer": steer}, defaults, ["v", RANDOM], 4, 4000)
    assert json.loads(state.extra) == json.loads(steer) == {"vectors": [
        {"source": "random", "scale": 0.2, "layers": [1], "normalize": False, "seed": 5},
        {"source": "v", "scale": -0.1, "layers": [3], "normalize": True}]}


def _owner_and_stranger(tmp_path, seed: int):
    """A service with a library, an owner holding two vectors of their own ("main one" at layer 1, "added one" at
    layer 0) and a stranger: (service, owner, stranger, main's name, added's name)."""
    import dataclasses

    from steer_ui.policy import Policy
    from steer_ui.store import open_library
    from steer_ui.tiny import tiny_handle
    from steer_ui.vector import random_vector

    policy = Policy()
    service = Service(handle=tiny_handle("llama"), workdir=tmp_path, policy=policy,
                      library=open_library(str(tmp_path / "library.db"), policy))
    owner, stranger = "saved-owner-aaaaaaaaaa", "saved-stranger-aaaaaaa"
    service.claim_owner(owner, None)
    service.claim_owner(stranger, None)
    hidden = service.handle.arch.hidden_size
    main = service.add_vector(owner, dataclasses.replace(random_vector(hidden, 1, seed=seed), name="main one"))
    other = service.add_vector(owner, dataclasses.replace(random_vector(hidden, 0, seed=seed + 1), name="added one"))
    return service, owner, stranger, main, other


def test_a_saved_result_keeps_each_added_row_s_own_vector_for_a_stranger(tmp_path):
    """An Explore result steered by the owner's own vector and an added row's own (unshared) vector keeps both with
    it, by content (issue #48): a stranger's fresh session opens every term, the link's checks keep it, and it
    steers to the owner's numbers, even after the owner removes the added vector."""
    from steer_ui.ui import url_state

    service, owner, stranger, main, other = _owner_and_stranger(tmp_path, 51)
    extra = extra_terms.compose(2, [(other, 0, -0.6, True, 0), (RANDOM, 1, 0.3, False, 4)])
    spec = extra_terms.full_spec(main, 1, 0.5, True, 0, extra)
    sampling = service.sampling(max_new_tokens=5, greedy=True)
    settings = {"vector": main, "layer": 1, "alpha": 0.5, "relative": True, "seed": 0, "extra": extra}
    owners = list(service.stream_generate_for(owner, PROMPT, spec, sampling, settings))[-1]
    numbers = service.next_token_for(owner, PROMPT, spec).as_dict()
    result_id = service.save_result(owner, {"prompt": PROMPT, **settings, "next_token": numbers})
    assert service.keeper.library.remove(service.session(owner).owner, "vector", other)  # gone from the owner's

    saved = service.result(result_id)
    assert saved["has_vector"] and set(saved["term_vectors"]) == {other}
    for item_id in saved["term_vectors"].values():  # the kept vector's own item is no result to open
        with pytest.raises(UserError):
            service.result(item_id)
    assert other not in service.vector_names(stranger)
    vector = service.open_result_vector(stranger, result_id)
    opened = service.open_result_terms(stranger, result_id)
    assert opened == {other: f"{other} (saved result)"}
    notices = []
    shown = url_state.added_terms(extra_terms.renamed(saved["view"]["extra"], opened),
                                  service.vector_names(stranger), service.handle.arch.num_layers, notices)
    assert notices == [] and [t.source for t in extra_terms.added(shown)] == [opened[other], "random"]
    theirs_spec = extra_terms.full_spec(vector, 1, 0.5, True, 0, shown)
    theirs = list(service.stream_generate_for(stranger, PROMPT, theirs_spec, sampling))[-1]
    assert theirs.steered_text == owners.steered_text != owners.unsteered_text
    assert service.next_token_for(stranger, PROMPT, theirs_spec).as_dict() == numbers


def test_a_saved_comparison_keeps_each_added_row_s_own_vector_for_a_stranger(tmp_path):
    """Many prompts run with an added row of the owner's own (unshared) vector, saved, keeps that vector with it
    by content (issue #48), as a saved Explore result does: after the owner removes it, a stranger's session opens
    it under its own name (the held spec renamed as the tab's show_saved does) and steers to the owner's table."""
    service, owner, stranger, main, other = _owner_and_stranger(tmp_path, 61)
    prompts = "The weather today is\nMy favourite food is"
    sampling = service.sampling(max_new_tokens=5, greedy=True)
    held = extra_terms.held(True, 0, extra_terms.compose(2, [(other, 0, -0.6, True, 0), (RANDOM, 1, 0.3, False, 4)]))
    owners = service.compare(owner, prompts, False, main, 1, 0.5, True, 0, 1.0, sampling=sampling, held=held)
    result_id = service.save_comparison(owner)
    assert service.keeper.library.remove(service.session(owner).owner, "vector", other)  # gone from the owner's

    saved = service.result(result_id)
    assert saved["kind"] == "comparison" and saved["has_vector"] and set(saved["term_vectors"]) == {other}
    assert other not in service.vector_names(stranger)
    vector = service.open_result_vector(stranger, result_id)
    opened = service.open_result_terms(stranger, result_id)
    assert opened == {other: f"{other} (saved result)"}
    settings = compare_tab.opened_settings({**saved, "opened_vector": vector, "opened_terms": opened})
    assert settings["vector"] == vector
    theirs_held = settings["held"]
    assert [t["source"] for t in theirs_held["vectors"]] == [opened[other], "random"]
    assert opened[other] in service.vector_names(stranger)
    theirs = service.compare(stranger, prompts, False, vector, 1, 0.5, True, 0, 1.0, sampling=sampling,
                             held=json.dumps(theirs_held))
    assert [r["steered"] for r in theirs["rows"]] == [r["steered"] for r in owners["rows"]]
    assert [r["kl"] for r in theirs["rows"]] == pytest.approx([r["kl"] for r in owners["rows"]], abs=1e-6)
    alone = service.compare(stranger, prompts, False, vector, 1, 0.5, True, 0, 1.0, sampling=sampling)
    assert [r["kl"] for r in alone["rows"]] != pytest.approx([r["kl"] for r in owners["rows"]], abs=1e-6)


def test_a_saved_comparison_s_vectors_refused_here_are_not_opened_by_their_saved_names(tmp_path):
    """Where the link could not open a comparison's own vectors (say, they no longer fit the model), a row opened
    in Explore named them by their saved names, which in the viewer's session may be other vectors of theirs (a
    review): the main vector is left as Explore has it and the refused added row is left out."""
    service, owner, stranger, main, other = _owner_and_stranger(tmp_path, 62)
    held = extra_terms.held(True, 0, extra_terms.compose(2, [(other, 0, -0.6, True, 0), (RANDOM, 1, 0.3, False, 4)]))
    service.compare(owner, PROMPT, False, main, 1, 0.5, True, 0, 1.0,
                    sampling=service.sampling(max_new_tokens=3, greedy=True), held=held)
    saved = service.result(service.save_comparison(owner))
    assert saved["has_vector"] and set(saved["term_vectors"]) == {other}
    settings = compare_tab.opened_settings({**saved, "opened_vector": None, "opened_terms": {}})  # both refused
    assert settings["vector"] is None  # open_row keeps Explore's own vector (gr.skip)
    assert [t["source"] for t in settings["held"]["vectors"]] == ["random"]
    assert saved["settings"]["vector"] == main and other in json.dumps(saved["settings"]["held"])  # as saved
    # a comparison whose only added row was the refused one has none left (a spec of none is refused where a row
    # opens, so the row did not open at all)
    alone = extra_terms.held(True, 0, extra_terms.compose(1, [(other, 0, -0.6, True, 0)]))
    service.compare(owner, PROMPT, False, main, 1, 0.5, True, 0, 1.0,
                    sampling=service.sampling(max_new_tokens=3, greedy=True), held=alone)
    only = service.result(service.save_comparison(owner))
    assert compare_tab.opened_settings({**only, "opened_vector": None, "opened_terms": {}})["held"] is None
    assert extra_terms.renamed(json.dumps(only["settings"]["held"]), {other: None}) == ""


def test_save_result_pressed_while_the_newest_generation_decodes_keeps_that_one(tmp_path):
    """Save result while the page's generation for the added row's new α still decodes (a Chromium run under load
    saved the view with the previous α's text): it waits for that generation and keeps it, not the last finished."""
    import dataclasses
    import threading

    service, owner, _stranger, main, other = _owner_and_stranger(tmp_path, 61)
    sampling = dataclasses.replace(service.sampling(max_new_tokens=150, greedy=True), stop_at_eos=False)

    def settings(scale):
        return {"vector": main, "layer": 1, "alpha": 0.5, "relative": True, "seed": 0,
                "extra": extra_terms.compose(2, [(other, 0, scale, True, 0)])}

    def generate(scale):
        s = settings(scale)
        return service.stream_generate_for(owner, PROMPT, extra_terms.full_spec(main, 1, 0.5, True, 0, s["extra"]),
                                           sampling, s, supersede=True)

    list(generate(0.0))  # the row just added: its α at 0, generated to the end
    newest = generate(0.7)  # the α dragged: this one decodes while Save is pressed
    next(newest)
    reader = threading.Thread(target=lambda: list(newest))  # the page's own thread reads it on
    reader.start()
    result_id = service.save_result(owner, {"prompt": PROMPT, **settings(0.7)})
    reader.join(timeout=60)
    kept = service.result(result_id)["generation"]
    assert kept["settings"]["extra"] == settings(0.7)["extra"] and len(kept["steered"]["tokens"]) == 150
