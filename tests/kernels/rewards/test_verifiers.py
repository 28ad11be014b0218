import sys

import pytest

from policylab.errors import NonFiniteError, PolicylabError, ShapeError
from policylab.kernels.rewards import exact_numeric_reward, extract_last_number, math_verify_reward, numeric_match


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 42.", "42"),  # trailing period is punctuation, not a decimal point
        ("42", "42"),
        ("It is -7!", "-7"),  # sign kept
        ("\u22127", "-7"),  # typographic minus sign
        ("+4", "4"),
        ("1,234", "1234"),  # thousands separator removed
        ("Total: 10,000.50 dollars", "10000.50"),
        ("3,4", "4"),  # not a thousands group: two numbers, the last is 4
        ("1,2345", "2345"),  # malformed grouping: 1 then 2345
        ("8-3", "3"),  # '-' after a digit is an operator, not a sign
        ("x = -3.5; done", "-3.5"),
        (".5", "0.5"),
        ("1.2.3", "1.2"),
        ("3 + 4 = 7", "7"),  # the LAST number
        ("seven", None),
        ("", None),
    ],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


def test_extract_rejects_non_str():
    with pytest.raises(TypeError, match="`text` must be a str"):
        extract_last_number(42)


def test_numeric_match_integers_exact_and_tolerance_can_fail():
    assert numeric_match("42", 42)
    assert numeric_match("42.0", "42")
    assert numeric_match("-3", -3)
    assert not numeric_match("41", 42)
    # arbitrary precision for integers: a float comparison would call these equal
    assert not numeric_match(str(10**20 + 1), 10**20)
    # float tolerance 1e-9 absorbs binary noise: 0.1 + 0.2 = 0.30000000000000004
    assert numeric_match("0.3", 0.1 + 0.2)
    # ... but not a visible difference: |0.3000001 - 0.3| = 1e-7 > max(1e-9 * 0.3, 1e-9)
    assert not numeric_match("0.3000001", 0.3)
    assert not numeric_match("0.33", 1 / 3)
    # a looser explicit tolerance accepts it
    assert numeric_match("0.3000001", 0.3, abs_tol=1e-6)
    assert not numeric_match(None, 3)
    assert not numeric_match("abc", 3)  # unparseable prediction: no match, not an error


def test_numeric_match_bad_gold_raises():
    with pytest.raises(PolicylabError, match="gold answer 'seven' is not a number"):
        numeric_match("7", "seven")
    with pytest.raises(NonFiniteError, match="not finite"):
        numeric_match("7", float("nan"))
    with pytest.raises(TypeError, match="gold answer must be"):
        numeric_match("1", True)
    with pytest.raises(TypeError, match="`pred` must be a str"):
        numeric_match(7, 7)


def test_exact_numeric_reward_last_number_rule():
    completions = [
        "The answer is 12.",  # last number 12 == 12 -> 1
        "12 or 13",  # last number 13 != 12 -> 0
        "",  # empty reply: no number -> 0
        "twelve",  # no digits -> 0
        "1,200",  # 1200 == "1,200" gold -> 1
    ]
    answers = [12, "12", 12, 12, "1,200"]
    assert exact_numeric_reward(completions, answers) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_exact_numeric_reward_bad_inputs():
    with pytest.raises(ShapeError, match="`completions` has 2 entries but `answers` has 1"):
        exact_numeric_reward(["1", "2"], [1])
    with pytest.raises(TypeError, match="single str"):
        exact_numeric_reward("12", ["12"])
    with pytest.raises(TypeError, match=r"`completions\[1\]` must be a str"):
        exact_numeric_reward(["1", None], [1, 1])


def test_math_verify_missing_package_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install 'policylab\[math\]'"):
        math_verify_reward(["1"], ["1"])


def test_math_verify_reward_real_package():
    pytest.importorskip("math_verify")
    completions = [
        "So the result is $\\frac{1}{2}$.",  # equivalent to 0.5 -> 1
        "The answer is \\boxed{3}",  # 3 != 0.5 -> 0
        "",  # empty -> 0
        "x = 7",  # 7 == 7 -> 1
    ]
    assert math_verify_reward(completions, ["0.5", "0.5", "0.5", 7]) == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ShapeError):
        math_verify_reward(["1"], ["1", "2"])
