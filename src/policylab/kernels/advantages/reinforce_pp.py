"""REINFORCE++: KL-shaped return-to-go with batch-global normalization, and its
group-baseline variant with a global (batch or EMA) scale.

Paper: "REINFORCE++" by Hu et al., arXiv:2501.03262. The title changed across revisions:
the first ones read "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both
Prompt and Reward Models", a later one "REINFORCE++: Stabilizing Critic-Free Policy
Optimization with Global Advantage Normalization"; which one the library cites is
**unconfirmed**. The k1 per-token KL in the reward and A_t = r − β·Σ_{u≥t} KL_u are
confirmed against descriptions of the paper; the EMA scale is a library option, not from
the paper (see `EmaScale`).
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape
from policylab.errors import BatchReuseError, PolicylabError, ShapeError
from policylab.kernels.advantages.group import Groups, check_nonneg, check_rewards
from policylab.kernels.advantages.gae import whiten


def reinforce_pp_returns(
    rewards: torch.Tensor,
    kl_penalty: torch.Tensor | None,
    mask: torch.Tensor,
) -> torch.Tensor:
    """KL-shaped return-to-go before whitening, `[B, T]`.

        A_t = r − Σ_{u ≥ t, valid} pen_u        pen_t = β · k(lp_old,t, lp_ref,t)

    (terminal reward, γ = 1). The per-token penalty is `kl.reward_penalty` (detached, from
    the sampler's logp_old; the paper's estimator is k1 = lp_old − lp_ref, k2 and k3 are
    explicit alternatives); None = no KL term (A_t = r).
    Example: k1 values [0.1, 0.2, 0.3], β = 1, r = 1 → [0.4, 0.5, 0.7].

    Args:
        rewards: `[B]` scalar reward of each response (one sample per prompt is fine).
        kl_penalty: `[B, T]` β·KL estimate per token, or None.
        mask: `[B, T]` bool, True = the token counts; every row needs >= 1 valid token
            (otherwise its reward would be silently dropped: ShapeError).

    Exactly 0 where `mask` is False (NaN there cannot leak). Detached (the KL enters the
    reward, not the loss); dtype of `kl_penalty` (of `rewards` without one).
    """
    check_mask(mask, "mask")
    if mask.dim() != 2:
        raise ShapeError(f"`mask` must be [B, T], got {tuple(mask.shape)}")
    check_rewards(rewards)
    if rewards.shape[0] != mask.shape[0]:
        raise ShapeError(f"`rewards` has {rewards.shape[0]} entries but `mask` has {mask.shape[0]} rows")
    empty = ~mask.any(dim=1)
    if bool(empty.any()):
        rows = empty.nonzero().squeeze(-1).tolist()[:10]
        raise ShapeError(f"`mask` row(s) {rows} have no valid token: their reward would be dropped")
    if kl_penalty is None:
        dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
        r = rewards.detach().to(dtype).unsqueeze(1)
        return torch.where(mask, r.expand(mask.shape), torch.zeros((), dtype=dtype))
    check_same_shape("mask", mask, kl_penalty=kl_penalty)
    check_finite(kl_penalty, "kl_penalty", mask)
    zero = torch.zeros((), dtype=kl_penalty.dtype, device=kl_penalty.device)
    pen = torch.where(mask, kl_penalty.detach(), zero)
    to_go = pen.flip(1).cumsum(1).flip(1)
    r = rewards.detach().to(kl_penalty.dtype).unsqueeze(1)
    return torch.where(mask, r - to_go, zero)


def reinforce_pp(
    rewards: torch.Tensor,
    kl_penalty: torch.Tensor | None,
    mask: torch.Tensor,
    *,
    eps: float = 1e-8,
    std: str = "population",
) -> torch.Tensor:
    """REINFORCE++ token advantages, `[B, T]`: `reinforce_pp_returns` whitened over all
    valid tokens of the batch,

        A ← (A − mean_batch A) / (std_batch A + eps)

    with `std` the convention of the batch std ("population" default; the paper does not
    say). Then the PPO clip objective (a separate stage). Detached, 0 where `mask` is
    False. Args as in `reinforce_pp_returns`.
    """
    returns = reinforce_pp_returns(rewards, kl_penalty, mask)
    return whiten(returns, mask, eps=eps, std=std)


class EmaScale:
    """Exponential moving average of the second moment of group-centred rewards, the
    global scale of `reinforce_pp_baseline(scale="ema")`.

        m ← d · m + (1 − d) · mean_i(c_i²)     once per training batch;  scale = √m

    `decay` d in [0, 1) is explicit (no default: it is **unconfirmed**, the paper does not
    describe an EMA). Library decision: the first update sets m to the batch value (no
    zero start, so no bias correction is needed).

    Only `update` changes the state, and `reinforce_pp_baseline` calls it only when its
    caller passes `update=True`: evaluation passes `update=False`, so evaluation batches
    never reach the state. `update(..., batch_id=...)` refuses every id it has already
    folded in (BatchReuseError), so no training batch can advance the EMA twice, in a row
    or later (A, B, A is refused too). `state_dict()` / `load_state_dict()` let the trainer
    checkpoint it, the ids seen included.
    """

    def __init__(self, decay: float):
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise PolicylabError(f"`decay` must be a number in [0, 1), got {decay!r}")
        self.decay = float(decay)
        self.second_moment: float | None = None
        self.n_updates = 0
        self.last_batch_id: str | None = None
        self.seen_batch_ids: set[str] = set()

    @property
    def scale(self) -> float:
        """√m; raises before the first update (evaluation cannot initialize it)."""
        if self.second_moment is None:
            raise PolicylabError(
                "EmaScale has no state yet: the first call must be a training call with update=True"
            )
        return math.sqrt(self.second_moment)

    def update(self, centred: torch.Tensor, *, batch_id: str | None = None) -> None:
        """Fold one training batch of centred rewards `[B]` into the average."""
        check_rewards(centred, "centred")
        if batch_id is not None and batch_id in self.seen_batch_ids:
            last = " (the last one)" if batch_id == self.last_batch_id else " (not the last one: a stale batch)"
            raise BatchReuseError(
                f"EmaScale already advanced on batch {batch_id!r}{last}; it advances once per batch"
            )
        batch_moment = float((centred.detach().double() ** 2).mean())
        if self.second_moment is None:
            self.second_moment = batch_moment
        else:
            self.second_moment = self.decay * self.second_moment + (1.0 - self.decay) * batch_moment
        self.n_updates += 1
        self.last_batch_id = batch_id
        if batch_id is not None:
            self.seen_batch_ids.add(batch_id)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "second_moment": self.second_moment,
                "n_updates": self.n_updates, "last_batch_id": self.last_batch_id,
                "seen_batch_ids": sorted(self.seen_batch_ids)}

    def load_state_dict(self, state: dict) -> None:
        if float(state["decay"]) != self.decay:
            raise PolicylabError(
                f"checkpointed EmaScale has decay {state['decay']}, this one {self.decay}; "
                "build it with the checkpointed decay"
            )
        self.second_moment = state["second_moment"]
        self.n_updates = int(state["n_updates"])
        self.last_batch_id = state["last_batch_id"]
        # checkpoints written before the ids were all kept hold only the last one
        seen = state.get("seen_batch_ids")
        self.seen_batch_ids = set(seen) if seen is not None else (
            {self.last_batch_id} if self.last_batch_id is not None else set())


def reinforce_pp_baseline(
    rewards: torch.Tensor,
    group: torch.Tensor,
    *,
    scale: str,
    ema: EmaScale | None = None,
    update: bool | None = None,
    batch_id: str | None = None,
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++ with baseline: group-mean centring, then one global scale, `[B]`.

        c_i = r_i − mean_g r                  (local centring only)
        A_i = c_i / (s + eps),  s = √(mean_batch c²)        scale = "batch_std"
                                s = EmaScale.scale           scale = "ema"

    The batch mean of c is 0 (each group sums to 0), so √(mean c²) is the population std
    of the centred values; this is the convention of the hand-worked case:
    groups [1, 0] and [0.6, 0.4] → c = [0.5, −0.5, 0.1, −0.1], s = √0.13 = 0.3606 →
    [1.387, −1.387, 0.277, −0.277] (unbiased std √(0.52/3) would give ±1.201, ±0.240).
    The 5:1 gap between groups is kept, where group-local std would give ±1 to both.

    Args:
        scale: "batch_std" or "ema" (no default: the choice changes the method).
        ema: the EmaScale, required with "ema", refused with "batch_std".
        update: required with "ema": True on training batches (advances the EMA with this
            batch's c first, then divides by the updated scale), False on evaluation
            batches (reads the scale, never changes it). Ignored with "batch_std" (no
            state), so a trainer may pass update=True for every training batch.
        batch_id: passed to `EmaScale.update` (refuses advancing twice on one batch).
        eps: added to the scale, >= 0.

    Singleton and all-equal groups give exactly 0. Detached; dtype of `rewards`.
    """
    check_rewards(rewards)
    check_nonneg(eps, "eps")
    groups = Groups.of(group, rewards.shape[0])
    centred = groups.standardize(rewards.detach(), None, 0.0)
    if scale == "batch_std":
        if ema is not None:
            raise PolicylabError("scale='batch_std' uses no EmaScale: pass ema=None")
        s = (centred * centred).mean().sqrt()
    elif scale == "ema":
        if ema is None:
            raise PolicylabError("scale='ema' needs `ema`, an EmaScale owned (and checkpointed) by the trainer")
        if not isinstance(update, bool):
            raise PolicylabError(
                "scale='ema' needs an explicit `update`: True on training batches, False on evaluation"
            )
        if update:
            ema.update(centred, batch_id=batch_id)
        s = centred.new_tensor(ema.scale)
    else:
        raise PolicylabError(f"`scale` must be 'batch_std' or 'ema', got {scale!r}")
    return centred / (s + eps)
