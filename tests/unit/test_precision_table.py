"""The precision table's tool on a tiny model: every precision is compared, and a difference is located."""
from steer_ui.tools.precision_table import compare, first_difference


def test_first_difference_is_one_based_and_none_when_identical():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 2


def test_compare_reports_each_precision_against_float32():
    rows = compare("tiny:llama", 4)
    assert [r["weights"] for r in rows] == ["int8", "bfloat16"]
    for row in rows:
        assert 0 < row["max_abs_dp"] < 0.5 and row["top1"].endswith("/6") and len(row["parts_at"]) == 6
