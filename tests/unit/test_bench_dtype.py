"""The benchmark's --model/--device/--dtype flags and its accuracy-cost measure (no timing assertions)."""
import json

import torch

from steer_ui.cli import main
from steer_ui.model.loading import load_model
from steer_ui.tools.bench import markdown_table
from steer_ui.tools.measures import bench_dtype_accuracy, float32_reference, next_token_probs


def test_bench_cli_on_a_random_model_in_bfloat16_reports_the_accuracy_cost(capsys):
    code = main(["bench", "--model", "random:llama-mini", "--device", "cpu", "--dtype", "bfloat16", "--quick",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["model"]["model_id"] == "random:llama-mini" and out["model"]["dtype"] == "bfloat16"
    assert out["conditions"]["device"] == "cpu" and out["conditions"]["dtype"] == "bfloat16"
    accuracy = out["dtype_accuracy"]
    assert accuracy["reference"] == "random:llama-mini loaded in float32"
    # bfloat16 rounds weights and arithmetic: the distributions differ, but not by much
    assert 0 < out["ratios"]["max_abs_delta_prob_vs_float32"] == accuracy["max_abs_delta_prob"] < 0.05
    assert "max_abs_delta_prob_vs_float32" in markdown_table(out)


def test_float32_is_its_own_reference_and_a_bfloat16_copy_differs():
    h32 = load_model("random:llama-mini", device="cpu", dtype="float32")
    with float32_reference(h32, print) as reference:
        assert reference is h32
        assert bench_dtype_accuracy(h32, reference, print)["max_abs_delta_prob"] == 0.0
    h16 = load_model("random:llama-mini", device="cpu", dtype="bfloat16")
    with float32_reference(h16, lambda _m: None) as reference:
        assert reference.dtype == torch.float32 and reference.source == h16.source
        measured = bench_dtype_accuracy(h16, reference, lambda _m: None)["max_abs_delta_prob"]
    direct = float((next_token_probs(h16) - next_token_probs(h32)).abs().max())
    assert measured == direct > 0
    assert next_token_probs(h32).sum(-1).allclose(torch.ones(6))


def test_bench_refuses_an_unknown_dtype_in_one_json_line(capsys):
    code = main(["bench", "--model", "random:llama-mini", "--dtype", "float8", "--quick", "--json"])
    assert code == 2 and "float8" in json.loads(capsys.readouterr().out)["error"]


def test_int8s_accuracy_is_the_cost_of_the_arithmetic_the_loader_switched_on():
    """With int8 weights the figure comes from the first load's measurement: of float32 arithmetic, or of the
    integer-product path in use (issue #50: the unembedding on int16 activations), named in the table."""
    from types import SimpleNamespace

    cost = {"max_abs_dp": 9e-7, "top1_agree": 6, "prompts": 6, "max_abs_ddlogit": 2e-5,
            "w8a8": {"on": False, "max_abs_dp": 0.07, "top1_agree": 6, "prompts": 6, "max_abs_ddlogit": 2.7},
            "w8a16_unembedding": {"on": True, "max_abs_dp": 1.4e-4, "top1_agree": 6, "prompts": 6,
                                  "max_abs_ddlogit": 0.005}}
    handle = SimpleNamespace(weights="int8", precision_cost=cost, dtype=torch.float32)
    measured = bench_dtype_accuracy(handle, None, print)
    assert measured["max_abs_delta_prob"] == 1.4e-4 and "unembedding's products on int16" in measured["dtype"]
    cost["w8a16"] = {"on": True, "max_abs_dp": 2.9e-4, "top1_agree": 6, "prompts": 6, "max_abs_ddlogit": 0.01}
    cost["in_use"] = "w8a16"  # the loader's choice on a machine with a packed path (AMX's tiles, AVX-512 VNNI)
    measured = bench_dtype_accuracy(handle, None, print)
    assert measured["max_abs_delta_prob"] == 2.9e-4 and "every product on int16" in measured["dtype"]
    del cost["in_use"]
    cost["w8a16_unembedding"]["on"] = False
    measured = bench_dtype_accuracy(handle, None, print)
    assert measured["max_abs_delta_prob"] == 9e-7 and measured["dtype"] == "int8 weights, float32 arithmetic"
