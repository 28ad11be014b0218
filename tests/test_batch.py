"""RolloutBatch: validation, role requirements, selection and concatenation."""

import pytest
import torch

from policylab import MissingQuantityError, RolloutBatch, SamplingSettings, ShapeError
from policylab.batch import concat_batches


def make_batch(B=4, P=3, T=5, **kw):
    tokens = torch.arange(B * (P + T)).view(B, P + T) % 50
    att = torch.ones(B, P + T, dtype=torch.bool)
    att[0, 0] = False  # a left-padded prompt
    lengths = torch.tensor([5, 3, 1, 4])[:B]
    loss_mask = torch.arange(T).expand(B, T) < lengths.unsqueeze(-1)
    att[:, P:] = loss_mask
    fields = dict(
        tokens=tokens, attention_mask=att, loss_mask=loss_mask, prompt_width=P,
        group=torch.tensor([7, 7, 3, 3])[:B], policy_version=torch.zeros(B, dtype=torch.long),
        batch_id="b0", source=("native",) * B,
    )
    fields.update(kw)
    return RolloutBatch(**fields)


def test_valid_batch_and_derived_fields():
    b = make_batch(logp_behavior=-torch.rand(4, 5)).validate()
    assert b.response_lengths.tolist() == [5, 3, 1, 4]
    assert b.response_tokens.shape == (4, 5)


def test_missing_role_names_method_field_and_remedy():
    b = make_batch()
    with pytest.raises(MissingQuantityError, match=r"tis needs `logp_behavior`.*rollout engine"):
        b.require("tis", "logp_behavior")
    with pytest.raises(ValueError, match="logp_old"):  # MissingQuantityError is a ValueError
        b.require("ppo", "logp_old")


def test_shape_mismatch_between_logprobs_and_mask():
    with pytest.raises(ShapeError, match=r"`logp_old` must be \[B, T\]"):
        make_batch(logp_old=-torch.rand(4, 6)).validate()


def test_nonfinite_logprob_at_counted_position_is_refused_but_padding_is_not_checked():
    lp = -torch.rand(4, 5)
    lp[2, 3] = float("nan")  # sequence 2 has length 1: position 3 is padding
    make_batch(logp_old=lp).validate()
    lp[0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        make_batch(logp_old=lp).validate()


def test_positive_logprob_refused():
    lp = -torch.rand(4, 5)
    lp[0, 0] = 0.5
    with pytest.raises(ShapeError, match="> 0"):
        make_batch(logp_ref=lp).validate()


def test_loss_mask_on_padding_refused_and_mask_dtype():
    b = make_batch()
    att = b.attention_mask.clone()
    att[1, 3 + 0] = False
    with pytest.raises(ShapeError, match="padding"):
        b.replace(attention_mask=att).validate()
    with pytest.raises(ShapeError, match="bool"):
        b.replace(loss_mask=b.loss_mask.float()).validate()


def test_nan_reward_refused():
    with pytest.raises(ValueError, match="rewards"):
        make_batch(rewards=torch.tensor([1.0, float("nan"), 0.0, 0.0])).validate()


def test_non_contiguous_group_ids_are_valid_and_group_rows_by_id():
    # ids 10 and 2, interleaved: accepted as they are (not renumbered), and a group
    # statistic over them pairs rows 0, 2 and rows 1, 3. GRPO with population std, rewards
    # (1, 0, 0, 0): group 10 = rows (0, 2), mean 0.5, std 0.5 -> (1, -1)·0.5/(0.5 + 1e-6);
    # group 2 = rows (1, 3), no spread -> 0
    from policylab.kernels import advantages

    group = torch.tensor([10, 2, 10, 2])
    b = make_batch(group=group, rewards=torch.tensor([1.0, 0.0, 0.0, 0.0])).validate()
    assert b.group.tolist() == [10, 2, 10, 2]
    a = advantages.grpo(b.rewards.double(), b.group, std="population", eps=1e-6)
    x = 0.5 / (0.5 + 1e-6)
    torch.testing.assert_close(a, torch.tensor([x, 0.0, -x, 0.0], dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert b.select(torch.tensor([2, 0])).group.tolist() == [10, 10]


def test_float_group_ids_refused():
    with pytest.raises(ValueError, match="integer"):
        make_batch(group=torch.tensor([0.0, 0.0, 1.0, 1.0])).validate()


def test_non_positive_temperature_refused():
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SamplingSettings(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(top_p=0.0)


def test_interval_low_above_high_refused():
    with pytest.raises(ShapeError, match="low > high"):
        make_batch(reward_intervals=torch.tensor([[0.0, 1.0], [0.5, 0.2], [0.0, 0.0], [0.1, 0.2]])).validate()


def test_select_keeps_rows_and_provenance():
    b = make_batch(rewards=torch.tensor([1.0, 2.0, 3.0, 4.0]), outcome={"correct": torch.tensor([1, 0, 1, 0])},
                   source=("native", "expert", "native", "hinted"),
                   producer=("policy", "solver:arithmetic", "policy", "policy"))
    s = b.select(torch.tensor([3, 1]))
    assert s.rewards.tolist() == [4.0, 2.0]
    assert s.source == ("hinted", "expert") and s.producer == ("policy", "solver:arithmetic")
    assert s.outcome["correct"].tolist() == [0, 0]
    assert s.batch_id == b.batch_id
    s.validate()


def test_concat_realigns_prompts_and_responses():
    a = make_batch(B=4, P=3, T=5, rewards=torch.ones(4), logp_behavior=-torch.ones(4, 5))
    b = make_batch(B=4, P=2, T=6, rewards=torch.zeros(4), logp_behavior=-torch.ones(4, 6))
    c = concat_batches([a, b], "merged").validate()
    assert c.tokens.shape == (8, 3 + 6) and c.prompt_width == 3
    # the second batch's prompts were left-padded by one column; responses start at column 3
    assert torch.equal(c.tokens[4:, 1:3 + 6], b.tokens)
    assert not c.attention_mask[4:, 0].any()
    assert c.response_lengths.tolist() == a.response_lengths.tolist() + b.response_lengths.tolist()
    assert c.batch_id == "merged"


def test_concat_refuses_mixed_presence():
    a = make_batch(rewards=torch.ones(4))
    b = make_batch()
    with pytest.raises(ValueError, match="only some carry `rewards`"):
        concat_batches([a, b], "x")
