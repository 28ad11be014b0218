"""policylab advantage stages as verl advantage estimators (``policylab_<stage>``): each
stage that works from verl's token-level rewards and uid groups, returning (advantages,
returns) shaped [bs, T]. Parameters come from ``+algorithm.policylab.<name>=<value>``."""

from __future__ import annotations

from typing import Any

import torch

from policylab.errors import PolicylabError
from policylab.integrations import hosting
from policylab.integrations.verl.engine import ENGINE, PREFIX, plain
from policylab.methods.loss import tensor_inputs
from policylab.methods.spec import RunShape

# ----------------------------------------------------------------------------- advantages


def uid_groups(index, B: int, device) -> torch.Tensor:
    if index is None:
        raise PolicylabError("policylab advantage estimators need verl's uid groups (index=...)")
    ids: dict[Any, int] = {}
    return torch.tensor([ids.setdefault(u, len(ids)) for u in list(index)], dtype=torch.long, device=device)


def token_reward_batch(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index):
    """A batch holding verl's token-level rewards the way policylab's advantage stages read
    them: `rewards` = the reward at the last counted token, `extras["kl_penalty"]` = minus
    the rewards before it (verl puts only the KL-in-reward penalty there). Then a scalar
    reward is r − Σ_t penalty = Σ_t token_level_rewards, and a return-to-go is
    Σ_{u ≥ t} token_level_rewards_u, exactly."""
    mask = response_mask.bool()
    B, T = mask.shape
    tlr = torch.where(mask, token_level_rewards, torch.zeros((), dtype=token_level_rewards.dtype))
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(-1).values
    if bool((last < 0).any()):
        raise PolicylabError("a response with no counted token reached the advantage estimator")
    at_last = pos == last.unsqueeze(-1)
    r = tlr.gather(1, last.unsqueeze(-1)).squeeze(-1)
    before = torch.where(at_last, torch.zeros((), dtype=tlr.dtype), tlr)
    extras = {"kl_penalty": -before} if bool((before != 0).any()) else {}
    logp = torch.zeros(mask.shape, dtype=tlr.dtype, device=mask.device)
    return tensor_inputs(logp, r, mask, group=uid_groups(index, B, mask.device), rewards=r, extras=extras).batch


def make_estimator(stage, method):
    """verl's advantage-estimator signature for policylab advantage `stage` (with the
    parameters and defaults of `method`)."""
    from policylab.methods.context import StageContext

    name = PREFIX + stage.name

    def policylab_estimator(token_level_rewards, response_mask, config=None, index=None, **_unused):
        given = {}
        if config is not None and hasattr(config, "get"):
            given = plain(config.get("policylab", None))
        m = hosting.stage_params(stage, method, given, f"verl advantage estimator `{name}` (+algorithm.policylab.*)")
        batch = token_reward_batch(token_level_rewards, response_mask, index)
        ctx = StageContext(p=m.view(stage), state=hosting.replace_state(m, ENGINE), run=RunShape(),
                           policy_version=0, sampling=None, rollout=None, worker=None, score=None, next_train=None,
                           encode=None, new_groups=None, decode=None, task_reward=None)
        with torch.no_grad():
            adv = stage.fn(batch, ctx).adv
        mask = response_mask.bool()
        adv = adv.unsqueeze(-1).expand(mask.shape) if adv.dim() == 1 else adv
        adv = torch.where(mask, adv, torch.zeros((), dtype=adv.dtype)).to(token_level_rewards.dtype)
        return adv, adv.clone()

    policylab_estimator.__name__ = f"policylab_{stage.name}_estimator"
    policylab_estimator.__policylab__ = stage.name
    return policylab_estimator
