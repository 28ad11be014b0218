"""Loss stages: objectives, corrections, addends and terms over `LossInputs`.

Objectives turn the learner's log-probs into a per-token loss; corrections return
detached weights (or a replaced ratio denominator) that compose with ANY host objective;
addends are added to the policy loss matrix; terms are aggregated on masks of their own.
None of them aggregates, and none re-implements another's math.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels import advantages as A
from policylab.kernels import corrections as C
from policylab.kernels import kl as kl_mod
from policylab.kernels import objectives as O
from policylab.kernels.checks import masked_mean
from policylab.errors import PolicylabError
from policylab.methods.spec import LossInputs, Stage, Weighting
from policylab.methods.stage import bind

# ----------------------------------------------------------------------------- objectives
# A stage that only calls its kernel is a binding (`methods.stage.bind`): the kernel's inputs by
# role, its keyword arguments from the method's parameters. The others below do more.


def unit_policy_gradient(inp: LossInputs, p):
    """−A·exp(lp − sg(lp)): the policy gradient at ratio 1 (value −A, gradient −A·∇lp),
    for methods whose every batch gets exactly one update (no clip needed, none applied)."""
    return O.reinforce(inp.logp, inp.adv, inp.mask, carrier="unit")


def tapo(inp: LossInputs, p):
    eps0, tau = float(p.eps0), float(p.tau)

    def schedule(t: torch.Tensor) -> torch.Tensor:  # tightens with position: eps0 / sqrt(1 + t/tau)
        return eps0 / torch.sqrt(1.0 + t.to(inp.logp.dtype) / tau)

    return O.tapo(inp.logp, inp.logp_old, inp.adv, inp.mask, eps_schedule=schedule)


_RATIO = ("logp", "logp_old", "adv", "mask")
_BOUNDS = {"eps_low": "eps_low", "eps_high": "eps_high"}
PPO_CLIP = bind("objective", O.ppo_clip, _RATIO, {**_BOUNDS, "dual_clip": "dual_clip"}, inert_at_zero_adv=True)
GSPO = bind("objective", O.gspo, _RATIO, _BOUNDS, inert_at_zero_adv=True)
LUSPO = bind("objective", O.luspo, _RATIO, _BOUNDS)
CISPO = bind("objective", O.cispo, _RATIO, _BOUNDS, inert_at_zero_adv=True)
GPPO = bind("objective", O.gppo, _RATIO, _BOUNDS, inert_at_zero_adv=True)
REINFORCE = bind("objective", O.reinforce, ("logp", "adv", "mask"), inert_at_zero_adv=True)
UNIT_POLICY_GRADIENT = Stage("objective", unit_policy_gradient, kernels=(O.reinforce,), reads=("logp",),
                             inert_at_zero_adv=True)
RIPO = bind("objective", O.ripo, _RATIO, {"delta": "delta"})
GPPO_FDIV = bind("objective", O.gppo_fdiv, _RATIO, {"divergence": "divergence", "topology": "topology", "delta": "delta"})
TAPO = Stage("objective", tapo, kernels=(O.tapo,), params=("eps0", "tau"), reads=("logp", "logp_old"))

# ----------------------------------------------------------------------------- corrections
# The engine ratio k = π_old/μ compares the trainer's recompute at the sampling weights
# (`batch.logp_old`) with what the rollout engine sampled from: never the live logp.


def _engine_roles(inp: LossInputs, method: str):
    inp.batch.require(method, "logp_old", "logp_behavior")
    return inp.batch.logp_old, inp.batch.logp_behavior


def icepop_current(inp: LossInputs, p) -> Weighting:
    """IcePop's band on sg(π_θ)/μ: the learner itself is π_old in value (each batch gets
    exactly one update at the version that sampled it)."""
    inp.batch.require("online_icepop", "logp_behavior")
    w, m = C.icepop(inp.logp.detach(), inp.batch.logp_behavior, inp.mask, low=p.icepop_low, high=p.icepop_high)
    return Weighting(weight=w, metrics={k.replace("icepop/", "online_icepop/", 1): v for k, v in m.items()})


def engine_weight(inp: LossInputs, p) -> Weighting:
    """MiniRL: sg(π_old/μ), truncated at `engine_cap` (None: untruncated)."""
    cap = math.inf if p.engine_cap is None else p.engine_cap
    w, m = C.tis(*_engine_roles(inp, "minirl"), inp.mask, cap=cap)
    names = {"tis/frac_capped": "minirl/frac_engine_capped", "tis/weight_mean": "minirl/engine_weight_mean"}
    return Weighting(weight=w, metrics={names.get(k, k.replace("tis/", "minirl/", 1)): v for k, v in m.items()})


_ENGINE = {"tis": ("tis_cap",), "icepop": ("icepop_low", "icepop_high"), "kpop": ("kpop_delta", "kpop_weight")}
_DECOUPLED: dict = {}  # engine_correction -> its stage (filled below, once the stages exist)


def decoupled_engine(inp: LossInputs, p) -> Weighting:
    """Missing-old-logits: the chosen engine correction (`engine_correction`) on the
    discrepancy d = π_old/μ only; the host's clip acts on the staleness s = π_θ/π_old."""
    kind = p.engine_correction
    if kind in _DECOUPLED:
        return _DECOUPLED[kind].fn(inp, p)
    raise PolicylabError(f"missing_old_logits: engine_correction must be tis, icepop or kpop, got {kind!r}")


def sis_denominator(inp: LossInputs, p) -> Weighting:
    """SIS: an accepted token trains as on-policy, its ratio's denominator replaced by
    sg(logp) (ratio value 1, gradient ∇lp); a rejected one keeps the host's ratio and
    clipping. Acceptance was drawn once for the round (`rounds.SIS_ACCEPT`)."""
    if "sis_accepted" not in inp.batch.extras:
        raise PolicylabError("sis needs extras['sis_accepted'] (drawn once per round by the SIS_ACCEPT stage)")
    accepted = inp.batch.extras["sis_accepted"]
    n = inp.mask.sum().clamp(min=1)
    return Weighting(logp_old=torch.where(accepted, inp.logp.detach(), inp.logp_old),
                     metrics={"sis/accepted_frac": ((accepted & inp.mask).sum() / n).detach()})


def gmc(inp: LossInputs, p) -> Weighting:
    """GMC: the per-sequence weights computed for the whole round (`rounds.GMC_WEIGHTS`)."""
    if "gmc_weight" not in inp.batch.extras:
        raise PolicylabError("gmc needs extras['gmc_weight'] (computed once per round by the GMC_WEIGHTS stage)")
    return Weighting(weight=inp.batch.extras["gmc_weight"])


_ENG = ("logp_old", "logp_behavior")
_ENGINE_ROLES = ("batch.logp_old", "batch.logp_behavior", "mask")
TIS = bind("correction", C.tis, _ENGINE_ROLES, {"cap": "tis_cap"}, weighting=True)
ICEPOP = bind("correction", C.icepop, _ENGINE_ROLES, {"low": "icepop_low", "high": "icepop_high"}, weighting=True)
ICEPOP_CURRENT = Stage("correction", icepop_current, kernels=(C.icepop,), params=("icepop_low", "icepop_high"),
                       reads=("logp", "logp_behavior"))
KPOP = bind("correction", C.kpop, _ENGINE_ROLES, {"delta": "kpop_delta", "in_region_weight": "kpop_weight"},
            weighting=True)
MIS = bind("correction", C.mis, _ENGINE_ROLES, {"low": "mis_low", "high": "mis_high", "kind": "mis_kind",
                                                "mode": "mis_mode"}, weighting=True)
ENGINE_WEIGHT = Stage("correction", engine_weight, kernels=(C.tis,), params=("engine_cap",), reads=_ENG)
_DECOUPLED.update(tis=TIS, icepop=ICEPOP, kpop=KPOP)
DECOUPLED_ENGINE = Stage("correction", decoupled_engine, kernels=(C.tis, C.icepop, C.kpop),
                         params=("engine_correction",) + sum(_ENGINE.values(), ()), reads=_ENG)
SIS_DENOMINATOR = Stage("correction", sis_denominator, kernels=(C.sis,), reads=("extras.sis_accepted",))
GMC = Stage("correction", gmc, kernels=(C.gmc,), reads=("extras.gmc_weight",))

# ----------------------------------------------------------------------------- addends and terms


def kl_loss(inp: LossInputs, p):
    """β · k(lp, lp_ref) on every counted token, differentiable through lp (KL in the loss)."""
    inp.batch.require("KL in the loss", "logp_ref")
    est = getattr(kl_mod, p.kl_estimator)(inp.logp, inp.logp_ref)
    term = torch.where(inp.mask, est, torch.zeros((), dtype=est.dtype))
    return p.kl_coef * term, {"kl/loss_estimate": masked_mean(term, inp.mask)}


def kl_in_loss(p) -> bool:
    return p.kl_placement == "loss" and p.kl_coef > 0


def entropy_bonus(inp: LossInputs, p):
    """−c · H(π_θ(·|s_t)) on every counted token (an exploration bonus)."""
    if inp.entropy is None:
        raise PolicylabError("entropy_coef > 0 needs the per-token entropy of the current policy")
    return O.entropy_bonus(inp.entropy, inp.mask, coef=p.entropy_coef), {}


def positive_nll(inp: LossInputs, p):
    """μ · (−lp) on the tokens of correct responses (VAPO's positive-example LM loss)."""
    return p.nll_coef * A.positive_nll(inp.logp, inp.mask, _correct(inp.batch)), {}


def positive_nll_mask(batch, p) -> torch.Tensor:
    return batch.loss_mask & _correct(batch).unsqueeze(-1)


def _correct(batch) -> torch.Tensor:
    if "correct" not in batch.outcome:
        raise PolicylabError("the positive-example NLL term needs outcome['correct'] (the raw verifier result)")
    return batch.outcome["correct"].bool()


KL_LOSS = Stage("addend", kl_loss, kernels=(kl_mod.k1, kl_mod.k2, kl_mod.k3), params=("kl_coef", "kl_estimator",
                "kl_placement"), reads=("logp", "logp_ref"), active=kl_in_loss)
ENTROPY_BONUS = Stage("addend", entropy_bonus, kernels=(O.entropy_bonus,), params=("entropy_coef",), reads=("entropy",),
                      active=lambda p: p.entropy_coef > 0)
POSITIVE_NLL = Stage("term", positive_nll, name="nll", kernels=(A.positive_nll,), params=("nll_coef",), reads=("logp", "outcome.correct"),
                     active=lambda p: p.nll_coef > 0, term_mask=positive_nll_mask, term_aggregation="token_mean")
