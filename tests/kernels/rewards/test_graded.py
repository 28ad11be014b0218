"""The graded rule-based judges: intervals (Range-GRPO) and reward dimensions (GPRL)."""

import pytest
import torch

from policylab.errors import PolicylabError
from policylab.kernels.rewards.graded import numeric_interval, parse_dimensions, reward_vectors


def test_interval_judge_hand_cases():
    # gold 12: "12" exact -> [0.8, 1]; "13" d = 1 -> s = 0.6/2 = 0.3 -> [0.15, 0.3];
    # "no idea" -> [0, 0]; "40" d = 28 -> s = 0.6/29 = 0.020690 -> [0.010345, 0.020690]
    iv = numeric_interval(["12", "13", "no idea", "The answer is 40."], ["12"] * 4)
    want = torch.tensor([[0.8, 1.0], [0.15, 0.3], [0.0, 0.0], [0.6 / 29 / 2, 0.6 / 29]], dtype=torch.float64)
    torch.testing.assert_close(iv, want, rtol=0, atol=1e-12)
    # a right reply is determinately above every wrong one; no number is below every number,
    # even a far miss (0.010345 > 0)
    assert bool((iv[0, 0] > iv[1:, 1]).all()) and bool((iv[[1, 3], 0] > iv[2, 1]).all())


def test_dimensions_hand_cases_and_refusals():
    v = reward_vectors(["12", "The answer is 12", "13", "cat"], ["12"] * 4, ["correct", "closeness", "terse"])
    want = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0.5, 1], [0, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(v, want)
    with pytest.raises(PolicylabError, match="distinct names among correct"):
        parse_dimensions("correct,correct")
    with pytest.raises(PolicylabError, match="distinct names"):
        parse_dimensions("correct,style")
    with pytest.raises(PolicylabError, match="is not a number"):
        reward_vectors(["1"], ["one"], ["correct"])
    with pytest.raises(PolicylabError, match="2 replies but 1 answers"):
        numeric_interval(["1", "2"], ["1"])


def test_gprl_weights_must_match_the_dimensions():
    from policylab import methods
    from policylab.methods.spec import RunShape

    with pytest.raises(PolicylabError, match="has 2 weights for 3 reward dimensions"):
        methods.get("gprl").with_params({"dimension_weights": "1,1"}, RunShape())
    with pytest.raises(PolicylabError, match="dimensions.*distinct names"):
        methods.get("gprl").with_params({"dimensions": "correct,bogus"}, RunShape())
    m = methods.get("gprl").with_params({"dimensions": "correct,terse", "dimension_weights": "1,0.5"}, RunShape())
    assert m.p.dimensions == "correct,terse"
