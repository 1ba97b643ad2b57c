"""A view link is hostile input too: valid values restore the controls, the rest fall back with a notice."""
from steer_ui.ui import i18n
from steer_ui.ui.url_state import ExploreState, from_query

DEFAULTS = ExploreState(prompt="p", vector="v", layer=8, alpha=0.14, alpha_max=0.31)
VECTORS = ["random direction", "v", "w"]


def test_valid_values_restore_the_controls():
    state = from_query({"prompt": "Hello there", "layer": "5", "alpha": "0.05", "relative": "0", "vector": "w",
                        "seed": "3", "alpha_max": "2"}, DEFAULTS, VECTORS, 18, 4000)
    assert (state.prompt, state.layer, state.alpha, state.relative, state.vector, state.seed, state.alpha_max) == \
        ("Hello there", 5, 0.05, False, "w", 3, 2.0)
    assert state.notices == []


def test_an_alpha_beyond_the_range_widens_it():
    assert from_query({"alpha": "-3"}, DEFAULTS, VECTORS, 18, 4000).alpha_max == 3.0


def test_bad_values_fall_back_with_a_notice_and_unknown_keys_are_ignored():
    state = from_query({"layer": "99", "alpha": "nan", "vector": "someone's secret", "prompt": "x" * 5000,
                        "__proto__": "1", "seed": "-1"}, DEFAULTS, VECTORS, 18, 4000)
    assert (state.layer, state.alpha, state.vector, state.prompt, state.seed) == (8, 0.14, "v", "p", 0)
    assert len(state.notices) == 4 and any("not on this server" in n for n in state.notices)
    assert DEFAULTS.notices == []  # the defaults are never modified


def test_a_link_cannot_inject_markdown_or_push_alpha_past_the_field():
    state = from_query({"vector": "[Log in](https://evil)`x`", "layer": "<a href=x>", "alpha": "2e9",
                        "alpha_max": "1e-9"}, DEFAULTS, VECTORS, 18, 4000)
    banner = i18n.markdown("en", "link_notice", detail="; ".join(state.notices))  # as the page shows it
    assert r"\[Log in\]\(https\://evil\)\`x\`" in banner  # every Markdown special (and autolink) as itself
    assert "&lt;a href=x\\>" in banner and "<" not in banner  # and no tag: the layer is text too
    assert state.alpha == 1e6 and state.alpha_max == 1e6
    assert from_query({"alpha_max": "1e-9"}, DEFAULTS, VECTORS, 18, 4000).alpha_max == 0.001


def test_a_missing_vector_falls_back_to_the_default_at_its_own_settings():
    """Issue #36: the link's layer and α were chosen for its vector; the default vector is shown at its own."""
    from steer_ui.ui.url_state import fall_back

    defaults = ExploreState(prompt="p", vector="default", layer=8, alpha=0.14, alpha_max=0.28)
    state = from_query({"vector": "someone's vector", "layer": "3", "alpha": "5"}, defaults, ["default"], 18, 4000)
    assert fall_back(state, defaults, "someone's vector")
    assert (state.vector, state.layer, state.alpha, state.alpha_max) == ("default", 8, 0.14, 0.28)
    opened = from_query({"vector": "default", "layer": "3", "alpha": "0.5"}, defaults, ["default"], 18, 4000)
    assert not fall_back(opened, defaults, "default") and (opened.layer, opened.alpha) == (3, 0.5)
    shared = ExploreState(prompt="p", vector="v (shared)", layer=3, alpha=0.5, alpha_max=1.0)
    assert not fall_back(shared, defaults, "AbCdEfGhIjKlMnOpQrStUv", opened_ref="AbCdEfGhIjKlMnOpQrStUv")


def test_extend_range_travels_in_the_link_and_keeps_alpha_max():
    """The random walk opened a link made with Extend range ticked (α 19.5 on a ±20 slider over α max 4): without
    the flag the stranger's α max became 19.6, another view."""
    extended = from_query({"alpha": "19.5", "alpha_max": "4", "extend": "1"}, DEFAULTS, VECTORS, 18, 4000)
    assert extended.extend and extended.alpha == 19.5 and extended.alpha_max == 4.0
    plain = from_query({"alpha": "19.5", "alpha_max": "4"}, DEFAULTS, VECTORS, 18, 4000)
    assert not plain.extend and plain.alpha_max == 19.5  # an old link without the flag still shows its α
    assert not from_query({"extend": "0"}, DEFAULTS, VECTORS, 18, 4000).extend
