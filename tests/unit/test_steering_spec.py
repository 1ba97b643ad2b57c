"""Several vectors at once (issue #48): the steering spec's rules, and its terms' exact arithmetic on a tiny model."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from steer_ui import steering_spec
from steer_ui.messages import UserError
from steer_ui.service import Service
from steer_ui.vector import random_vector

SESSION = "spec-aaaaaaaaaaaaaaaa"


# ------------------------------------------------------------------------------------------------- the shape
def test_easysteer_s_vocabulary_and_its_aliases_read_as_one_spec():
    spec = steering_spec.parse('{"vectors": [{"source": "a", "scale": 0.3, "layers": [6], "normalize": true, '
                               '"apply": {"phases": ["generation"]}}, {"source": "random", "seed": 4, "alpha": -1, '
                               '"layer": 2, "normalize": false}, {"source": "b", "coefficient": 2}]}')
    first, second, third = spec.terms
    assert (first.source, first.scale, first.layers, first.normalize, first.positions) == ("a", 0.3, (6,), True,
                                                                                         "generated")
    assert second.random and (second.scale, second.layers, second.normalize, second.seed) == (-1.0, (2,), False, 4)
    assert third.layers == () and third.positions is None  # the vector's own layer and positions
    assert steering_spec.parse(spec.to_json()) == spec  # what a link or a saved result keeps reads back the same
    both = steering_spec.parse({"vectors": [{"source": "a", "scale": 1, "apply": {"phases": ["generation",
                                                                                            "prompt"]}}]})
    assert both.terms[0].positions == "all"


@pytest.mark.parametrize("spec, key", [
    ("{not json", "steering_not_json"),
    ({"vectors": []}, "steering_shape"),
    ({"vectors": [{"source": "a", "scale": 1}] * 9}, "steering_shape"),
    ({"vectors": [{"source": "a", "scale": 1}], "extra": 1}, "steering_shape"),
    ({"vectors": ["a"]}, "steering_term_not_object"),
    ({"vectors": [{"source": "a", "scale": 1, "algorithm": "direct"}]}, "steering_unknown_field"),
    ({"vectors": [{"source": "a", "scale": 1, "alpha": 2}]}, "steering_field_twice"),
    ({"vectors": [{"scale": 1}]}, "steering_no_source"),
    ({"vectors": [{"source": "a"}]}, "steering_no_scale"),
    ({"vectors": [{"source": "a", "scale": "strong"}]}, "number_not_a_number"),
    ({"vectors": [{"source": "a", "scale": float("nan")}]}, "number_not_finite"),
    ({"vectors": [{"source": "a", "scale": 1, "layers": "6"}]}, "steering_bad_layers"),
    ({"vectors": [{"source": "a", "scale": 1, "layers": [-1]}]}, "number_too_small"),
    ({"vectors": [{"source": "a", "scale": 1, "apply": {"phases": []}}]}, "steering_bad_phases"),
    ({"vectors": [{"source": "a", "scale": 1, "apply": {"phases": ["decode"]}}]}, "steering_bad_phases"),
    ({"vectors": [{"source": "a", "scale": 1, "normalize": "yes"}]}, "not_a_flag"),
])
def test_a_malformed_spec_is_refused_in_one_line_naming_what_is_wrong(spec, key):
    with pytest.raises(UserError) as caught:
        steering_spec.parse(spec)
    assert caught.value.key == key and "\n" not in str(caught.value)


@pytest.mark.parametrize("layer", [18, 10 ** 30, 1e30])
def test_a_layer_past_the_models_last_is_refused_naming_it_not_int64s_bound(layer):
    with pytest.raises(UserError) as caught:
        steering_spec.parse({"vectors": [{"source": "a", "scale": 1, "layers": [layer]}]}, layers=18)
    assert caught.value.key == "bad_layer" and "0 to 17" in str(caught.value), str(caught.value)
    assert steering_spec.parse({"vectors": [{"source": "a", "scale": 1, "layers": [17]}]}, layers=18).terms[0] \
        .layers == (17,)


# ----------------------------------------------------------------------------------------- the arithmetic
@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from steer_ui.tiny import tiny_handle

    return Service(handle=tiny_handle("llama"), workdir=tmp_path_factory.mktemp("spec"))


def _add(service, name, vector):
    return service.add_vector(SESSION, dataclasses.replace(vector, name=name))


def _probs(view) -> dict:
    return dict(zip(view.steered["token"], view.steered["prob"]))


def _close(a, b, tol=1e-5) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= tol for k in a)


def test_two_terms_of_one_vector_at_one_layer_equal_one_term_of_their_sum(service):
    hidden = service.handle.arch.hidden_size
    v = _add(service, "v", random_vector(hidden, 2, seed=11))
    prompt = "The weather today is"
    two = service.next_token_for(SESSION, prompt, {"vectors": [{"source": v, "scale": 0.4, "layers": [2]},
                                                               {"source": v, "scale": 0.7, "layers": [2]}]})
    one = service.next_token_for(SESSION, prompt, {"vectors": [{"source": v, "scale": 1.1, "layers": [2]}]})
    assert _close(_probs(two), _probs(one))
    assert two.kl == pytest.approx(one.kl, abs=1e-5) and two.kl > 1e-4  # it steered
    # a term at α = 0 is no term
    with_zero = service.next_token_for(SESSION, prompt, {"vectors": [{"source": v, "scale": 1.1, "layers": [2]},
                                                                     {"source": "random", "seed": 5, "scale": 0,
                                                                      "layers": [1]}]})
    assert _close(_probs(with_zero), _probs(one), tol=0)


def test_two_vectors_at_one_layer_equal_their_weighted_sum_saved_as_one_file(service, tmp_path):
    hidden = service.handle.arch.hidden_size
    v1, v2 = random_vector(hidden, 1, seed=1), random_vector(hidden, 1, seed=2)
    a, b = 3.0, -2.0
    n1, n2 = _add(service, "v1", v1), _add(service, "v2", v2)
    summed = dataclasses.replace(v1, directions={1: a * v1.direction(1) + b * v2.direction(1)}, name="sum")
    path = summed.save(tmp_path / "sum.safetensors")
    n_sum, _ = service.import_vector(SESSION, str(path))
    spec = {"vectors": [{"source": n1, "scale": a, "normalize": False}, {"source": n2, "scale": b,
                                                                          "normalize": False}]}
    file_spec = {"vectors": [{"source": n_sum, "scale": 1, "normalize": False}]}
    prompt = "My favourite food is"
    assert _close(_probs(service.next_token_for(SESSION, prompt, spec)),
                  _probs(service.next_token_for(SESSION, prompt, file_spec)))
    sampling = service.sampling(max_new_tokens=12, greedy=True)
    two = list(service.stream_generate_for(SESSION, prompt, spec, sampling))[-1]
    one = list(service.stream_generate_for(SESSION, prompt, file_spec, sampling))[-1]
    assert two.steered_text == one.steered_text and two.unsteered_text == one.unsteered_text
    assert [round(t.logprob, 4) for t in two.steered_tokens] == [round(t.logprob, 4) for t in one.steered_tokens]
    # what Save result keeps names every term
    kept = service.session(SESSION).last_generation["settings"]["steering"]
    assert [t["source"] for t in kept["vectors"]] == [n_sum]


def test_terms_at_different_layers_act_at_theirs(service):
    hidden = service.handle.arch.hidden_size
    v = _add(service, "w", random_vector(hidden, 1, seed=21))
    steers = service.steers_for(SESSION, {"vectors": [{"source": v, "scale": 1, "layers": [0, 3]},
                                                      {"source": "random", "seed": 2, "scale": 1, "layers": [2]}]})
    assert [s.layer for s in steers] == [0, 3, 2]
    assert torch.equal(steers[0].vector, steers[1].vector)  # one direction, acting at both of its layers


def test_a_spec_names_only_what_the_session_may_use(service):
    with pytest.raises(UserError) as caught:
        service.next_token_for(SESSION, "hi", {"vectors": [{"source": "/etc/passwd", "scale": 1}]})
    assert caught.value.key == "unknown_vector"
    with pytest.raises(UserError) as caught:
        service.next_token_for(SESSION, "hi", {"vectors": [{"source": "random", "scale": 1, "layers": [99]}]})
    assert caught.value.key == "bad_layer"
