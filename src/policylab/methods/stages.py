"""Stage adapters: how a recipe's named stages read a `RolloutBatch`.

Each adapter is a small function that pulls the fields its kernel needs out of the batch
(refusing the batch if one is missing), calls the pure kernel with scalars from the
recipe's parameters, and returns tensors plus detached diagnostics. The trainer calls
only these; the kernels never see a batch, a recipe or a config.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from .. import advantages as adv_mod
from .. import corrections as corr_mod
from .. import kl as kl_mod
from .. import objectives as obj_mod
from .._checks import masked_mean
from ..batch import RolloutBatch
from ..errors import PolicylabError
from .registry import KLSpec, Recipe

Params = Mapping[str, Any]

# ----------------------------------------------------------------------------- rewards


def token_rewards_from_outcome(batch: RolloutBatch) -> torch.Tensor:
    """[B, T]: the scalar reward placed at the last valid token of each response."""
    batch.require("token rewards", "rewards")
    mask = batch.loss_mask
    T = mask.shape[1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).max(-1).values  # [B], -1 if empty
    out = torch.zeros(mask.shape, dtype=batch.rewards.dtype, device=mask.device)
    has = last >= 0
    out[has.nonzero().squeeze(-1), last[has]] = batch.rewards[has]
    return out


def kl_reward_penalty(batch: RolloutBatch, kl: KLSpec, method: str) -> torch.Tensor:
    """[B, T] detached β·KL estimate per token from the sampler's logp_old (KL in the reward)."""
    batch.require(method, "logp_old", "logp_ref")
    return kl_mod.reward_penalty(batch.logp_old, batch.logp_ref, batch.loss_mask, coef=kl.coef, estimator=kl.estimator)


def _scalar_rewards(batch: RolloutBatch, recipe: Recipe) -> torch.Tensor:
    """[B] rewards, minus β·Σ_t KL when the recipe puts KL in the reward (applied once, here)."""
    batch.require(recipe.name, "rewards")
    r = batch.rewards
    if recipe.kl is not None and recipe.kl.placement == "reward":
        r = r - kl_reward_penalty(batch, recipe.kl, recipe.name).sum(-1)
    return r


# -------------------------------------------------------------------------- advantages


def _adv_grpo(batch, recipe, p, state):
    r = _scalar_rewards(batch, recipe)
    a = adv_mod.grpo(r, batch.group, std=p.get("std", "unbiased"), eps=p.get("eps", 1e-6))
    return a, adv_mod.group_stats(r, batch.group)


def _adv_dr_grpo(batch, recipe, p, state):
    r = _scalar_rewards(batch, recipe)
    return adv_mod.dr_grpo(r, batch.group), adv_mod.group_stats(r, batch.group)


def _adv_rloo(batch, recipe, p, state):
    r = _scalar_rewards(batch, recipe)
    return adv_mod.rloo(r, batch.group), adv_mod.group_stats(r, batch.group)


def _adv_remax(batch, recipe, p, state):
    batch.require(recipe.name, "greedy_rewards")
    r = _scalar_rewards(batch, recipe)
    return adv_mod.remax(r, batch.greedy_rewards), {}


def _adv_reinforce_pp(batch, recipe, p, state):
    if recipe.kl is None:
        # KL switched off (kl_coef=0): the return-to-go is the terminal reward alone; no
        # reference log-probs are read (the kernel's KL sum is multiplied by 0 here)
        batch.require(recipe.name, "rewards", "logp_old")
        a = adv_mod.reinforce_pp(batch.rewards, batch.logp_old, batch.logp_old, batch.loss_mask, kl_coef=0.0)
        return a, {}
    batch.require(recipe.name, "rewards", "logp_old", "logp_ref")
    a = adv_mod.reinforce_pp(batch.rewards, batch.logp_old, batch.logp_ref, batch.loss_mask, kl_coef=recipe.kl.coef)
    return a, {}


def _adv_reinforce_pp_baseline(batch, recipe, p, state):
    r = _scalar_rewards(batch, recipe)
    scale = p.get("scale", "batch_std")
    ema = state.get("ema_scale") if scale == "ema" else None
    a = adv_mod.reinforce_pp_baseline(r, batch.group, scale=scale, ema=ema, update=True, batch_id=batch.batch_id if ema is not None else None)
    return a, adv_mod.group_stats(r, batch.group)


def _token_rewards(batch, recipe):
    tr = batch.token_rewards if batch.token_rewards is not None else token_rewards_from_outcome(batch)
    if recipe.kl is not None and recipe.kl.placement == "reward":
        tr = tr - kl_reward_penalty(batch, recipe.kl, recipe.name)
    return tr


def _adv_gae(batch, recipe, p, state):
    batch.require(recipe.name, "values")
    adv, ret = adv_mod.gae(_token_rewards(batch, recipe), batch.values, batch.loss_mask, gamma=p["gamma"], lam=p["lam"])
    if p.get("whiten", False):
        adv = adv_mod.whiten(adv, batch.loss_mask, eps=1e-8)
    state["returns"] = ret
    return adv, {}


def _adv_vapo(batch, recipe, p, state):
    batch.require(recipe.name, "values")
    adv, ret, info = adv_mod.vapo_advantages(
        _token_rewards(batch, recipe), batch.values, batch.loss_mask,
        alpha=p["alpha"], lam_critic=p.get("lam_critic", 1.0), gamma=p.get("gamma", 1.0),
    )
    state["returns"] = ret
    return adv, info


def _adv_grpo_process(batch, recipe, p, state):
    ex = batch.extras
    for key in ("step_rewards", "step_ends", "step_mask"):
        if key not in ex:
            raise PolicylabError(
                f"grpo_process needs per-step rewards: batch.extras['{key}'] is missing. Score each "
                "reasoning step (a process reward model or a rule) and record step_rewards [B,K], "
                "step_ends [B,K] and step_mask [B,K]."
            )
    a = adv_mod.grpo_process(
        ex["step_rewards"], ex["step_ends"], ex["step_mask"], batch.group,
        T=batch.loss_mask.shape[1], std=p.get("std", "unbiased"), eps=p.get("eps", 1e-6),
    )
    return a, {}


ADVANTAGES: dict[str, Callable] = {
    "grpo": _adv_grpo,
    "dr_grpo": _adv_dr_grpo,
    "rloo": _adv_rloo,
    "remax": _adv_remax,
    "reinforce_pp": _adv_reinforce_pp,
    "reinforce_pp_baseline": _adv_reinforce_pp_baseline,
    "gae": _adv_gae,
    "vapo": _adv_vapo,
    "grpo_process": _adv_grpo_process,
}


def compute_advantages(recipe: Recipe, batch: RolloutBatch, state: dict) -> tuple[torch.Tensor, dict]:
    """Advantages `[B]` or `[B, T]` for `batch` under `recipe` (detached)."""
    fn = ADVANTAGES[recipe.advantage]
    adv, info = fn(batch, recipe, recipe.params, state)
    return adv.detach(), info


# -------------------------------------------------------------------------- objectives
# Each adapter: (logp [B,T] learner, logp_old [B,T], adv [B] or [B,T], mb, params) -> (loss [B,T], metrics)


def _obj_ppo(logp, logp_old, adv, mb, p):
    return obj_mod.ppo_clip(logp, logp_old, adv, mb.loss_mask, eps_low=p["eps_low"], eps_high=p["eps_high"], dual_clip=p.get("dual_clip"))


def _obj_gspo(logp, logp_old, adv, mb, p):
    return obj_mod.gspo(logp, logp_old, adv, mb.loss_mask, eps_low=p["eps_low"], eps_high=p["eps_high"])


def _obj_luspo(logp, logp_old, adv, mb, p):
    return obj_mod.luspo(logp, logp_old, adv, mb.loss_mask, eps_low=p["eps_low"], eps_high=p["eps_high"])


def _obj_cispo(logp, logp_old, adv, mb, p):
    return obj_mod.cispo(logp, logp_old, adv, mb.loss_mask, eps_low=p["eps_low"], eps_high=p["eps_high"])


def _obj_gppo(logp, logp_old, adv, mb, p):
    return obj_mod.gppo(logp, logp_old, adv, mb.loss_mask, eps_low=p["eps_low"], eps_high=p["eps_high"])


def _obj_reinforce(logp, logp_old, adv, mb, p):
    return obj_mod.reinforce(logp, adv, mb.loss_mask)


def _obj_ripo(logp, logp_old, adv, mb, p):
    return obj_mod.ripo(logp, logp_old, adv, mb.loss_mask, delta=p["delta"])


def _obj_gppo_fdiv(logp, logp_old, adv, mb, p):
    return obj_mod.gppo_fdiv(logp, logp_old, adv, mb.loss_mask, divergence=p["divergence"], topology=p["topology"], delta=p["delta"])


def _obj_tapo(logp, logp_old, adv, mb, p):
    eps0, tau = float(p["eps0"]), float(p["tau"])

    def schedule(t: torch.Tensor) -> torch.Tensor:  # tightens with position: eps0 / sqrt(1 + t/tau)
        return eps0 / torch.sqrt(1.0 + t.to(logp.dtype) / tau)

    return obj_mod.tapo(logp, logp_old, adv, mb.loss_mask, eps_schedule=schedule)


def _obj_ggpo(logp, logp_old, adv, mb, p):
    mb.require("ggpo", "logp_ref", "rewards")
    return obj_mod.ggpo(logp, mb.logp_ref, mb.rewards, mb.group, mb.loss_mask, beta=p["beta"], coef_clip=p["coef_clip"])


def _obj_online_icepop(logp, logp_old, adv, mb, p):
    mb.require("online_icepop", "logp_behavior")
    return corr_mod.online_icepop(logp, mb.logp_behavior, adv, mb.loss_mask, low=p["icepop_low"], high=p["icepop_high"])


def _obj_minirl(logp, logp_old, adv, mb, p):
    mb.require("minirl", "logp_behavior")
    return corr_mod.minirl_loss(logp, logp_old, mb.logp_behavior, adv, mb.loss_mask,
                                eps_low=p["eps_low"], eps_high=p["eps_high"], engine_cap=p.get("engine_cap"))


def _obj_decoupled(logp, logp_old, adv, mb, p):
    """missing_old_logits: engine correction on π_old/μ x PPO clip on π_θ/π_old. `logp_old`
    here must be the exact trainer log-probs at the sampling version (the trainer computes
    them right after sampling, before any update: the snapshot route)."""
    mb.require("missing_old_logits", "logp_old", "logp_behavior")
    version = int(mb.policy_version.max())
    if int(mb.policy_version.min()) != version:
        raise PolicylabError("missing_old_logits: a minibatch mixes policy versions; tag each slice separately")
    old = corr_mod.VersionedLogprobs(mb.logp_old, version, "trainer", "exact")
    beh = corr_mod.VersionedLogprobs(mb.logp_behavior, version, mb.engine, "exact")
    kind = p["engine_correction"]
    if kind == "tis":
        kwargs = {"cap": p["tis_cap"]}
    elif kind == "icepop":
        kwargs = {"low": p["icepop_low"], "high": p["icepop_high"]}
    elif kind == "kpop":
        kwargs = {"delta": p["kpop_delta"], "in_region_weight": p["kpop_weight"]}
    else:
        raise PolicylabError(f"missing_old_logits: engine_correction must be tis, icepop or kpop, got {kind!r}")
    return corr_mod.decoupled_loss(logp, old, beh, adv, mb.loss_mask, correction=p["engine_correction"],
                                   correction_kwargs=kwargs, eps_low=p["eps_low"], eps_high=p["eps_high"])


def _obj_sis(logp, logp_old, adv, mb, p):
    """SIS on a PPO host: accepted tokens get the unit carrier (ratio value 1, gradient
    ∇lp: logp_old replaced by sg(logp) there), rejected tokens keep the host's ratio
    π_θ/π_old and its clipping. Acceptance was drawn once for the round by the trainer."""
    if "sis_accepted" not in mb.extras:
        raise PolicylabError("sis needs extras['sis_accepted'] (the trainer draws it once per round from the "
                             "behavior top-K recorded at sampling: rollout with record_topk > 0)")
    mb.require("sis", "logp_old")
    accepted = mb.extras["sis_accepted"]
    old_eff = torch.where(accepted, logp.detach(), logp_old)
    loss, m = obj_mod.ppo_clip(logp, old_eff, adv, mb.loss_mask, eps_low=p["eps_low"], eps_high=p["eps_high"])
    n = mb.loss_mask.sum().clamp(min=1)
    m["sis/accepted_frac"] = ((accepted & mb.loss_mask).sum() / n).detach()
    return loss, m


OBJECTIVES: dict[str, Callable] = {
    "sis": _obj_sis,
    "ppo_clip": _obj_ppo,
    "gspo": _obj_gspo,
    "luspo": _obj_luspo,
    "cispo": _obj_cispo,
    "gppo": _obj_gppo,
    "reinforce": _obj_reinforce,
    "ripo": _obj_ripo,
    "gppo_fdiv": _obj_gppo_fdiv,
    "tapo": _obj_tapo,
    "ggpo": _obj_ggpo,
    "online_icepop": _obj_online_icepop,
    "minirl": _obj_minirl,
    "decoupled": _obj_decoupled,
}

# ------------------------------------------------------------------------- corrections
# Each adapter: (mb, sg(logp) [B,T], params) -> (detached weights [B,T] or [B], metrics)


def _corr_tis(mb, logp_now, p):
    mb.require("tis", "logp_old", "logp_behavior")
    return corr_mod.tis(mb.logp_old, mb.logp_behavior, mb.loss_mask, cap=p["tis_cap"])


def _corr_icepop(mb, logp_now, p):
    mb.require("icepop", "logp_old", "logp_behavior")
    return corr_mod.icepop(mb.logp_old, mb.logp_behavior, mb.loss_mask, low=p["icepop_low"], high=p["icepop_high"])


def _corr_kpop(mb, logp_now, p):
    mb.require("kpop", "logp_old", "logp_behavior")
    return corr_mod.kpop(mb.logp_old, mb.logp_behavior, mb.loss_mask, delta=p["kpop_delta"], in_region_weight=p["kpop_weight"])


def _corr_mis(mb, logp_now, p):
    mb.require("mis", "logp_old", "logp_behavior")
    return corr_mod.mis(mb.logp_old, mb.logp_behavior, mb.loss_mask, low=p["mis_low"], high=p["mis_high"],
                        kind=p["mis_kind"], mode=p["mis_mode"])


def _corr_gmc(mb, logp_now, p):
    """Trajectory weight = geometric-mean ratio of the current weights (detached) to the
    behavior that sampled (a stale version in async mode), capped per group."""
    mb.require("gmc", "logp_behavior")
    r = corr_mod.seq_ratio_geomean(logp_now, mb.logp_behavior, mb.loss_mask)
    return corr_mod.gmc(r.ratio.to(logp_now.dtype), mb.group, cap=p["gmc_cap"])


CORRECTIONS: dict[str, Callable] = {
    "tis": _corr_tis, "icepop": _corr_icepop, "kpop": _corr_kpop, "mis": _corr_mis, "gmc": _corr_gmc,
}

# --------------------------------------------------------------------------- the loss


# objectives whose per-token loss is A x (a finite factor of the token's own ratio): a
# sequence whose advantage is 0 on every counted token contributes exactly 0 to the loss
# and to the gradient (row-local: no objective here couples rows)
_A_PROPORTIONAL = frozenset({"ppo_clip", "cispo", "gppo", "gspo", "reinforce"})


def zero_advantage_rows_inert(recipe: Recipe) -> bool:
    """True when rows with A = 0 on every counted token can be left out of the training
    forward without changing the update: an A-proportional objective, and no other loss
    term (no KL in the loss, no entropy bonus, no NLL term). Their tokens still count in
    the normalizers, which are computed over the whole minibatch first."""
    p = recipe.params
    return (
        recipe.objective in _A_PROPORTIONAL
        and not (recipe.kl is not None and recipe.kl.placement == "loss" and recipe.kl.coef != 0)
        and not p.get("entropy_coef", 0.0)
        and not p.get("nll_coef", 0.0)
    )


def term_masks(recipe: Recipe, mb: RolloutBatch) -> dict[str, tuple[torch.Tensor, str]]:
    """Each loss term's (mask, aggregation mode), for normalizers computed once per
    optimizer step over the whole minibatch."""
    terms = {"policy": (mb.loss_mask, recipe.aggregation)}
    if recipe.params.get("nll_coef", 0.0) > 0:
        correct = _correct(mb, recipe)
        terms["nll"] = (mb.loss_mask & correct.unsqueeze(-1), "token_mean")
    return terms


def _correct(mb: RolloutBatch, recipe: Recipe) -> torch.Tensor:
    if "correct" not in mb.outcome:
        raise PolicylabError(f"{recipe.name} needs outcome['correct'] (raw verifier result) for its NLL term")
    return mb.outcome["correct"].bool()


def loss_terms(
    recipe: Recipe,
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    mb: RolloutBatch,
    entropy: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-token loss matrices `[B, T]` by term name, and detached metrics.

    policy = objective(logp, logp_old, adv) x detached correction weight
             + β·KL estimator (when the KL is placed in the loss) − entropy_coef·entropy
    nll    = −logp on tokens of correct responses (VAPO's positive-example LM loss), x nll_coef
    `logp_old` is the batch's recomputed old log-probs, or sg(logp) for a single on-policy
    update (the trainer decides and records which)."""
    p, mask = recipe.params, mb.loss_mask
    loss, metrics = OBJECTIVES[recipe.objective](logp, logp_old, adv, mb, p)
    metrics = {f"policy/{k}": v for k, v in metrics.items()}
    if recipe.correction is not None:
        w, cm = CORRECTIONS[recipe.correction](mb, logp.detach(), p)
        loss = loss * (w.unsqueeze(-1) if w.dim() == 1 else w)
        metrics.update({f"correction/{k}": v for k, v in cm.items()})
    zero = torch.zeros((), dtype=loss.dtype)
    if recipe.kl is not None and recipe.kl.placement == "loss":
        mb.require(recipe.name, "logp_ref")
        est = getattr(kl_mod, recipe.kl.estimator)(logp, mb.logp_ref)
        kl_term = torch.where(mask, est, zero)
        loss = loss + recipe.kl.coef * kl_term
        metrics["kl/loss_estimate"] = masked_mean(kl_term, mask)
    coef = p.get("entropy_coef", 0.0)
    if coef:
        if entropy is None:
            raise PolicylabError("entropy_coef > 0 needs the per-token entropy of the current policy")
        loss = loss - coef * torch.where(mask, entropy, zero)
    terms = {"policy": loss}
    if p.get("nll_coef", 0.0) > 0:
        correct = _correct(mb, recipe).unsqueeze(-1) & mask
        terms["nll"] = p["nll_coef"] * torch.where(correct, -logp, zero)
    return terms, metrics
