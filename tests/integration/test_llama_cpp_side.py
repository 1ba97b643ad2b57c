"""The llama.cpp side of the bench's measures (issue #50) on the embedded model, where llama_cpp is installed.

llama.cpp's batch of eight (one ``llama_decode`` per step, eight sequence ids) must decode what llama.cpp decodes
for each prompt alone, or the ratio would time a wrong batch; both measures run end to end on a few tokens.  No
timing assertions.  Skipped where llama-cpp-python is not installed (it is not a dependency: docs/bench.md).
"""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.integration
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (docs/bench.md: "
                                                    "pip install llama-cpp-python==0.3.36)")

from steer_ui.tools.measures import seeded_steer  # noqa: E402
from steer_ui.tools.vs_llama_cpp import (BATCH8_PROMPTS, LlamaCppBatch, bench_batch8_vs_llama_cpp,  # noqa: E402
                                         bench_vs_llama_cpp, llama_cpp_gguf, loaded_llama, prompt_ids,
                                         set_control_vector)


def test_llama_cpps_batch_of_eight_decodes_each_prompt_as_llama_cpp_decodes_it_alone(gemma):
    _, gguf = llama_cpp_gguf(gemma)
    steer, _ = seeded_steer(gemma, gemma.arch.num_layers // 2)
    ids = [prompt_ids(gemma, prompt) for prompt in BATCH8_PROMPTS]
    with loaded_llama(llama_cpp, gguf, 2) as llm:
        assert set_control_vector(llama_cpp, llm.ctx, steer, gemma.arch.num_layers, gemma.arch.hidden_size) == 0
        alone = []
        for prompt in (ids[0], ids[-1]):
            llm.reset()
            made = []
            for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
                made.append(token)
                if len(made) == 4:
                    break
            alone.append(made)
        batch = LlamaCppBatch(llama_cpp, llm, len(ids), max(map(len, ids)) + 4, sum(map(len, ids)), 2)
        try:
            assert set_control_vector(llama_cpp, batch.ctx, steer, gemma.arch.num_layers,
                                      gemma.arch.hidden_size) == 0
            seconds, together = batch.generate(ids, 4)
            _, again = batch.generate(ids, 4)  # the cache is cleared between runs
        finally:
            batch.close()
    assert seconds > 0 and [len(t) for t in together] == [4] * len(ids)
    assert [together[0], together[-1]] == alone and again == together


def test_both_llama_cpp_measures_run_on_the_embedded_model(gemma):
    layer = gemma.arch.num_layers // 2
    steer, _ = seeded_steer(gemma, layer)
    one = bench_vs_llama_cpp(gemma, steer, 4, 1, lambda _m: None)
    eight = bench_batch8_vs_llama_cpp(gemma, layer, 4, 1, lambda _m: None)
    assert one["status"] == eight["status"] == "measured", (one, eight)
    for name in ("vs_llama_cpp", "one_sequence_vs_llama_cpp"):
        assert math.isfinite(one[name]) and one[name] > 0
    assert math.isfinite(eight["batch8_vs_llama_cpp"]) and eight["batch8_vs_llama_cpp"] > 0
    assert eight["tokens_each"] == {"ours": [4], "llama_cpp": [4]} and eight["sequences"] == 8
    assert eight["first_sequence_tokens_agree"] >= 1  # same GGUF, same vector at the same block: same first token
