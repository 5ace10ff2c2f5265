"""Chapter 06d's reader of the reference run's results, and chapter 00's comparison rule, against hand-made files and a
hand computation."""
import json
import math

import pytest

from txl_lib.real_text import FIELDS, read_results
from txl_lib.utils import compare


def record(model, seed, bpc):
    return dict(model=model, seed=seed, params=10, train_chars=100, tgt_len=4, mem_len=None, folder="f",
                valid_bpc=bpc, test_bpc=bpc)


def test_records_are_grouped_by_model_in_seed_order(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": [record("b", 1, 2.0), record("a", 0, 1.0), record("b", 0, 3.0)]}))
    grouped = read_results(path)
    assert list(grouped) == ["b", "a"] and [r["seed"] for r in grouped["b"]] == [0, 1]


@pytest.mark.parametrize("content, message", [
    ([], "must hold"), ({"runs": []}, "must hold"), ({"runs": [{"model": "xl"}]}, "lacks"),
    ({"runs": [{k: 0 for k in FIELDS if k != "test_bpc"}]}, "test_bpc")])
def test_a_malformed_results_file_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        read_results(path)


def test_compare_follows_the_rule_of_twice_the_spread():
    a, b = [1.0, 1.2, 1.1], [2.0, 2.1, 1.9]                      # std 0.1 each
    gap, spread, verdict = compare(a, b)
    assert math.isclose(gap, -0.9) and math.isclose(spread, math.hypot(0.1, 0.1)) and verdict == "measurable"
    gap, spread, verdict = compare([1.0, 1.2], [1.05, 1.3], paired=True)   # differences -0.05, -0.1
    assert math.isclose(gap, -0.075) and math.isclose(spread, math.sqrt(2) * 0.025 / 1)
    assert verdict == "measurable"
    assert compare([1.0, 1.4], [1.1, 1.2])[2] == "no measurable difference"
