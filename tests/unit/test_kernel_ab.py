"""tools/kernel_ab.py: two builds of the fused block kernel decode in one process, and their texts are compared."""
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from steer_ui.model import fused_decode
from steer_ui.model.fused_decode import unsupported
from steer_ui.model.int8 import local_includes
from steer_ui.model.loading import load_model
from steer_ui.tools import kernel_ab

ROOT = Path(__file__).resolve().parents[2]


def _in_git() -> bool:
    return shutil.which("git") is not None and subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def handle():
    h = load_model("tiny:gemma3", device="cpu", weights="int8")
    if unsupported(h):
        pytest.skip(f"no fused step here: {unsupported(h)}")
    return h


@pytest.mark.skipif(not _in_git(), reason="needs a git checkout (the A side is a revision's sources)")
def test_a_revision_s_sources_are_written_beside_each_other(tmp_path):
    block = kernel_ab.sources_at("HEAD", tmp_path)
    assert block.name == "block_kernel.c" and (tmp_path / "int8_kernel.c").is_file()
    assert '#include "int8_kernel.c"' in block.read_text()


def test_the_same_kernel_gives_the_same_texts_and_a_changed_one_does_not(handle, tmp_path):
    source = fused_decode._SOURCE  # this tree's block kernel and the files it includes, copied beside each other
    for name in (source.name, *local_includes(source.read_bytes())):
        shutil.copy(source.parent / name, tmp_path / name)
    copy = tmp_path / source.name
    same = kernel_ab.compare(handle, copy, "The capital of France is", tokens=6, reps=2)
    for mode in kernel_ab.MODES:
        assert same[mode]["texts_equal"] and len(same[mode]["new_over_old"]) == 2
        assert all(x > 0 for x in same[mode]["old_ms"] + same[mode]["new_ms"])
    # the A side really is the other build: attention that ignores the keys decodes other text
    text = copy.read_text()
    assert "dot *= scaling;" in text
    copy.write_text(text.replace("dot *= scaling;", "dot *= 0.0f;"))
    changed = kernel_ab.compare(handle, copy, "The capital of France is", tokens=6, reps=1)
    assert not changed["steered_only"]["texts_equal"]


def test_the_vocab_pass_side_declines_inside_and_both_sides_decode_the_same_texts(handle, monkeypatch):
    """``kernel_ab --vocab-pass``: the old side is torch's passes (the summary declines inside), and a tiny model's
    greedy texts are the same either way (its vocabulary let through, as a real one is)."""
    from steer_ui.model import vocab_pass

    monkeypatch.setattr(vocab_pass._SHORTEST, "value", 0)
    x = torch.randn(1, 300)
    with vocab_pass.left_to_torch():
        assert vocab_pass.summarise(x, 3) is None
    assert vocab_pass.summarise(x, 3) is not None
    out = kernel_ab.alternate(handle, {"old": vocab_pass.left_to_torch, "new": kernel_ab.nullcontext},
                              "Once upon a time", 4, 2)
    assert all(out[mode]["texts_equal"] for mode in kernel_ab.MODES)


def test_the_unembedding_side_switches_its_activations_inside_and_puts_them_back(handle, monkeypatch):
    """``kernel_ab --unembedding-int16``: inside each side the unembedding's products take float or int16
    activations (its W8A16 switch, which the loader sets), and leaving puts back what the loader set; the
    many-users section runs for each side and reports its times and exactness."""
    from steer_ui.tools import many_users

    weight = handle.arch.int8_unembedding
    loaded = weight.w8a16
    for int16 in (True, False):
        with kernel_ab.unembedding_activations(handle, int16):
            assert weight.w8a16 is int16
        assert weight.w8a16 is loaded
    seen = []
    real = many_users.bench_many_users

    def short(h, layer, n_tokens, reps, log, moves=20):
        seen.append(weight.w8a16)
        return real(h, layer, 3, reps, log, moves=1)

    monkeypatch.setattr(many_users, "bench_many_users", short)
    sides = {"old": lambda: kernel_ab.unembedding_activations(handle, False),
             "new": lambda: kernel_ab.unembedding_activations(handle, True)}
    out = kernel_ab.many_users_alternated(handle, sides, 2)
    assert seen == [False, True, True, False]  # turn about, each rep starting with the other
    for side in ("old", "new"):
        assert [r["many_users_exact"] for r in out[side]["runs"]] == [8, 8]
        assert out[side]["median_concurrent_ms"] > 0


def test_the_block_side_switches_every_block_product_and_leaves_the_unembedding():
    """``kernel_ab --blocks-int16``: inside, every int8 weight but the unembedding takes int16 activations on packed
    weights (or float ones), the fused step still decodes, and leaving puts back what was set; where the fused step
    cannot take a block product on int16 activations the side says why instead of timing the dynamic path."""
    from steer_ui.model.int8 import int8_weights
    from rounded_activations import on_packed_weights

    h = load_model("tiny:gemma3", device="cpu", weights="int8")
    on_packed_weights(h)  # GGUF-like groups, every product on packed weights, as the loader sets it there
    unembedding = h.arch.int8_unembedding
    blocks = [w for w in int8_weights(h.model) if w is not unembedding]
    with kernel_ab.block_activations(h, False):
        assert not any(w.w8a16 for w in blocks) and unembedding.w8a16
        out = kernel_ab.alternate(h, {"old": kernel_ab.nullcontext, "new": kernel_ab.nullcontext},
                                  "Once upon a time", 3, 1)
        assert out["steered_only"]["texts_equal"]
    assert all(w.w8a16 for w in blocks)
    for w in blocks:
        w.group = 128  # wider than the packed path takes: the fused step would have to leave them
        w.packed = None
    with pytest.raises(RuntimeError, match="packed int16 product does not take"):
        with kernel_ab.block_activations(h, True):
            pass
    assert all(w.w8a16 for w in blocks)


def test_the_packed_int16_product_at_a_revision_is_timed_against_this_trees(tmp_path):
    """``kernel_ab --w8a16-old``: the kernel as a revision has it, built apart, takes the same packed weight;
    every shape and row count gets both builds' times and whether their outputs were equal bit for bit, and a
    build that sums otherwise is reported unequal, not hidden."""
    from steer_ui.model.int8 import _W8A16_SOURCE, _w8a16_kernel

    if _w8a16_kernel() is None or _w8a16_kernel().packed is None:
        pytest.skip("no packed int16 path here (the CPU lacks AMX's tiles and AVX-512 VNNI)")
    same = tmp_path / "same" / _W8A16_SOURCE.name
    same.parent.mkdir()
    same.write_bytes(_W8A16_SOURCE.read_bytes())
    shapes = ((40, 64, 32, False), (17, 96, 16, True))
    rows = kernel_ab.w8a16_products(same, 2, rows=(1, 9), shapes=shapes)
    assert [(r["shape"], r["rows"]) for r in rows] == [
        ("40 x 64 (group 32)", 1), ("40 x 64 (group 32)", 9), ("17 x 96 (group 16, affine)", 1),
        ("17 x 96 (group 16, affine)", 9)]
    assert all(r["equal"] and r["old_ms"] > 0 and r["new_ms"] > 0 for r in rows)
    # a build whose epilogue drops the high bytes' correction: every output moves
    other = tmp_path / "other" / _W8A16_SOURCE.name
    other.parent.mkdir()
    text = _W8A16_SOURCE.read_text()
    assert text.count("128 * hisum_g[") == 1
    other.write_text(text.replace("128 * hisum_g[", "0 * hisum_g["))
    if _w8a16_kernel().packed == "amx":
        pytest.skip("the tiles need no correction: the changed build gives the same bits here")
    assert not any(r["equal"] for r in kernel_ab.w8a16_products(other, 1, rows=(3,), shapes=shapes))


def test_the_high_bytes_build_leaves_out_only_the_low_bytes_products(tmp_path):
    """``kernel_ab --w8a16-high-bytes``: the copy differs from this tree's kernel in the two low-byte products
    alone, builds, and its sums differ from the whole product's (each output loses its low bytes' share), so the
    timing compares the two arithmetics it says it does."""
    from steer_ui.model.int8 import _W8A16_SOURCE, _w8a16_kernel

    path = kernel_ab.high_bytes_only(tmp_path)
    ours, theirs = _W8A16_SOURCE.read_text().splitlines(), path.read_text().splitlines()
    changed = [(a.strip(), b.strip()) for a, b in zip(ours, theirs) if a != b]
    assert len(ours) == len(theirs) and [b for _, b in changed] == ["(void)l4;", "(void)l4;"]
    assert sorted(a for a, _ in changed) == sorted(kernel_ab._LOW_BYTES)
    if _w8a16_kernel() is None or _w8a16_kernel().packed != "avx512-vnni":
        pytest.skip("the VNNI path on packed weights is not this machine's (no AVX-512 VNNI, or AMX's tiles)")
    rows = kernel_ab.w8a16_products(path, 1, rows=(1, 5), shapes=((40, 64, 32, False),))
    assert [r["rows"] for r in rows] == [1, 5] and not any(r["equal"] for r in rows)


@pytest.mark.skipif(not _in_git(), reason="not a git checkout")
def test_the_w8a16_source_at_a_revision_is_what_git_holds(tmp_path):
    from steer_ui.model.int8 import _W8A16_SOURCE

    path = kernel_ab.sources_at("HEAD", tmp_path, _W8A16_SOURCE)
    shown = subprocess.run(["git", "show", "HEAD:steer_ui/model/w8a16_kernel.c"], cwd=ROOT, capture_output=True,
                           check=True).stdout
    assert path.read_bytes() == shown


def test_the_huge_pages_side_reads_the_same_codes_from_huge_pages_and_the_other_from_small_ones():
    """``kernel_ab --huge-pages``: two copies of one packed weight, one kept off huge pages whatever the system
    would choose, one on them; both give the same outputs, so only the pages differ."""
    from steer_ui.model.int8 import _w8a16_kernel

    if _w8a16_kernel() is None or _w8a16_kernel().packed is None:
        pytest.skip("no packed int16 path here (the CPU lacks AMX's tiles and AVX-512 VNNI)")
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.is_file() or "[never]" in thp.read_text():
        pytest.skip("this kernel has transparent huge pages off (or none)")
    out = kernel_ab.huge_pages_products(2, rows=(1, 5), n=8192)  # 5 MiB of codes: two huge pages at least
    assert out["huge_kb"]["small"] == 0 and out["huge_kb"]["huge"] >= 4096, out["huge_kb"]
    assert [r["rows"] for r in out["rows"]] == [1, 5] and all(r["equal"] for r in out["rows"])
    assert all(r["small_ms"][0] > 0 and r["huge_ms"][0] > 0 for r in out["rows"])
