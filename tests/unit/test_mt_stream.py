"""A CPU generator's uniforms from the C kernel are torch.rand's, bit for bit, and leave the generator where torch would."""
import numpy as np
import pytest
import torch

from steer_ui.model import mt_stream, sampler
from steer_ui.model.generation import Request, Sampling

KERNEL = mt_stream._kernel()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no C compiler here")
# the AVX2 build of the same file, exercised on an AVX-512 machine too
BUILDS = [pytest.param((), id="native"), pytest.param(("-mno-avx512f",), id="avx2")]


@needs_kernel
@pytest.mark.parametrize("flags", BUILDS)
@pytest.mark.parametrize("seed", [0, 1, 2024, 2**32 - 1])
def test_the_kernel_draws_torchs_uniforms_across_every_regeneration_boundary(flags, seed):
    kernel = mt_stream._kernel(flags)
    ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    # counts that end a uniform on, just before and just after a 624-word regeneration, odd ones, a vocabulary
    for n in (1, 311, 312, 313, 0, 624, 7, 1000, 262_144, 3):
        expected = torch.rand(n, generator=theirs, dtype=torch.float64)
        got = mt_stream.rand64(ours, n, kernel=kernel)
        assert got.dtype == torch.float64 and torch.equal(got, expected), (seed, n)
    # the generator was left where torch's call leaves it: any later torch draw continues the same stream
    assert torch.equal(torch.rand(9, generator=ours, dtype=torch.float64),
                       torch.rand(9, generator=theirs, dtype=torch.float64))
    assert torch.equal(torch.randn(5, generator=ours), torch.randn(5, generator=theirs))
    assert torch.equal(ours.get_state(), theirs.get_state())


@needs_kernel
def test_draws_into_a_kept_buffer_are_the_same_numbers():
    ours, theirs = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    buffer = torch.empty(5000, dtype=torch.float64)
    for _ in range(3):
        got = mt_stream.rand64(ours, 5000, out=buffer)
        assert got is buffer and torch.equal(got, torch.rand(5000, generator=theirs, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous"):
        mt_stream.rand64(ours, 5000, out=torch.empty(4999, dtype=torch.float64))


@needs_kernel
def test_a_zero_uniform_is_raised_to_the_floor():
    # an all-zero state twists to zeros and tempers to zeros: every 53-bit value is 0
    words, left_next = np.zeros(624, dtype=np.uint32), np.array([1, 0], dtype=np.int32)
    out = torch.full((10,), -1.0, dtype=torch.float64)
    assert KERNEL(words.ctypes.data, left_next.ctypes.data, out.data_ptr(), 10, 1e-300) == 0
    assert torch.equal(out, torch.full((10,), 1e-300, dtype=torch.float64))
    assert left_next.tolist() == [625 - 20, 20]


@needs_kernel
def test_a_state_no_generator_could_be_in_is_refused():
    words, out = np.zeros(624, dtype=np.uint32), torch.empty(4, dtype=torch.float64)
    for bad in ([0, 0], [626, 0], [1, 625], [1, -1]):
        assert KERNEL(words.ctypes.data, np.array(bad, dtype=np.int32).ctypes.data, out.data_ptr(), 4, 0.0) == -1


def test_the_samplers_uniforms_are_torchs_clamped_ones():
    ours, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for _ in range(2):
        expected = torch.rand(262_144, generator=theirs, dtype=torch.float64).clamp_(min=1e-300)
        assert torch.equal(sampler.uniforms(ours, 262_144), expected)
    kept = torch.empty(262_144, dtype=torch.float64)  # torch's own draw writes into the caller's buffer too
    with mt_stream.left_to_torch():
        got = sampler.uniforms(ours, 262_144, out=kept)
    assert got is kept and torch.equal(got, torch.rand(262_144, generator=theirs, dtype=torch.float64))


def test_a_request_rewrites_one_noise_buffer_step_after_step(tiny):
    handle = tiny("llama")
    request = Request.make(handle, "a", [], Sampling(temperature=0.8, seed=3))
    reference = torch.Generator().manual_seed(3)
    first = request.uniforms(1000, "cpu")
    assert torch.equal(first, torch.rand(1000, generator=reference, dtype=torch.float64))
    second = request.uniforms(1000, "cpu")
    assert second is first and torch.equal(second, torch.rand(1000, generator=reference, dtype=torch.float64))


def test_left_to_torch_declines_the_kernel_inside_and_puts_it_back():
    rng = torch.Generator().manual_seed(5)
    with mt_stream.left_to_torch():
        assert mt_stream.rand64(rng, 10) is None
    assert (mt_stream.rand64(rng, 10) is not None) == (KERNEL is not None)


def test_the_cost_tool_draws_the_same_uniforms_both_ways_and_decodes_the_same_texts(tiny):
    """``python -m steer_ui.tools.sampling_cost --uniforms`` on a tiny model: equal draws, equal sampled texts."""
    from steer_ui.tools import sampling_cost

    draws = sampling_cost.time_uniforms(vocab=4099, reps=3)
    assert draws["equal"] and draws["torch.rand"] > 0 and draws["mt_stream"] > 0
    steps = sampling_cost.decode_with_each_draw(tiny("llama"), reps=2, tokens=4)
    assert set(steps) == {"steered only", "side by side"}
    for row in steps.values():
        assert row["texts_equal"] and len(row["torch.rand"]) == len(row["mt_stream"]) == 2
