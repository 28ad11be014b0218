"""Registered pipeline methods: the PPO stage of InstructGPT's three-stage RLHF
(`ppo_rlhf`; the whole pipeline is `policylab pipeline ppo_rlhf CONFIG`,
`policylab.pipelines.rlhf`) and the MOPD route of the fusion paradigms (`fusion`; Merge,
Mix RL and MOPD with per-domain reports are `policylab pipeline fusion CONFIG`,
`policylab.pipelines.fusion`).

Work in progress, NOT registered: `policylab.methods` does not import this module, there
is no `policylab pipeline` command yet, and neither the pipelines nor these specs have
tests or a real-model run. The cards below state what the code is meant to do; nothing
on them has been verified.
"""

from __future__ import annotations

from ..errors import PolicylabError
from .params import clip, on_policy_only, policy_gradient_method
from .registry import register
from .spec import Card, CriticSpec, Param, Stage, StateSpec, positive
from .stages import advantages as adv
from .stages import losses, pipelines, rewards
from .stages.provenance import DOMAIN_METRICS

_UNIT = lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"  # noqa: E731


def _needs_reward_model(run, p) -> None:
    if not p.reward_model:
        raise PolicylabError("ppo_rlhf needs a trained reward model: set method_params.reward_model to the directory "
                             "the pipeline's reward-model stage wrote (`policylab pipeline ppo_rlhf CONFIG` runs all "
                             "three stages), or 'untrained' for a plumbing test")


register(policy_gradient_method(
    "ppo_rlhf",
    Card(
        title="Training language models to follow instructions with human feedback", arxiv="2203.02155",
        family="pipeline (SFT -> reward model -> PPO)",
        samples="π_old: the policy, initialized from the SFT checkpoint (stage 1), at the current weights",
        learns="π_θ; critic V_φ (value head on a copy of the SFT policy)",
        reference="π_ref = the SFT policy (the run's initial weights): per-token KL in the reward, β·(lp_old − lp_ref)",
        critic="value head on a copy of the policy backbone, clipped value loss (the paper initializes it from the "
               "RM: library decision here)",
        summary="SFT on demonstrations, a pairwise reward model on ranked comparisons, then PPO whose reward is the "
                "RM score once at the last token minus the per-token KL to the SFT reference",
        status="not registered: work in progress, untested",
        not_established="human preference data, RM quality at scale or an RLHF result: the preferences are procedural "
                        "(a known score of the reply), the RM is trained on a few hundred pairs",
        unconfirmed=("pretraining mix (PPO-ptx, γ_ptx) not implemented: off, as in the paper's PPO (non-ptx) runs",),
        confirmed="RM loss −log σ(r_w − r_l) averaged over the C(K, 2) pairs of a prompt, all pairs of a prompt in one "
                  "batch element; equal scores give log 2 (to be tested); RM score added once at the last valid token; KL "
                  "shaping reads lp_old, β = 0.02 (the paper's PPO runs)",
    ),
    rewards_=(rewards.VERIFIER, pipelines.REWARD_MODEL_SCORE),
    advantage=adv.GAE, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + (
        Param("gamma", float, 1.0, "discount γ", check=_UNIT),
        Param("lam", float, 0.95, "GAE λ", check=_UNIT),
        Param("whiten", bool, False, "whiten the advantages over the batch's counted tokens"),
        Param("value_clip", float, 0.2, "clip range ε_v of the value loss (None: unclipped)", optional=True,
              check=positive),
        Param("reward_model", str, "", "the reward model: a directory the pipeline's RM stage wrote, or 'untrained' "
              "(a random head on the initial policy: plumbing tests only); '' is refused")),
    kl=(0.02, "k1", "reward"), kl_placements=("reward",), critic=CriticSpec(clip_param="value_clip"),
    model=(pipelines.REWARD_MODEL,),
    state=(StateSpec("reward_model", pipelines._rm_state, params=("reward_model",),
                     doc="the reward model, rebuilt from its directory (never stored in checkpoints)"),),
    checks=(_needs_reward_model,), exercise={"method_params": {"reward_model": "untrained"}},
))


def _teachers(p, seed):
    from ..mixedpolicy.state import Teachers

    return Teachers(p.teachers)


def _build_teachers(model, setup):
    """Build the domain teachers (mixedpolicy.state.Teachers) before the optimizer exists."""
    setup.state["teachers"].build(model, setup.tokenizer)
    return model


register(policy_gradient_method(
    "fusion",
    Card(
        title="Consolidating RLVR Capabilities Across Domains: A Deep Dive into Fusion Paradigms", arxiv="",
        family="pipeline (Merge / Mix RL / MOPD)",
        samples="the student (the learner) on prompts pooled from several domains",
        learns="the student π_θ", reference="the domain teachers (frozen RL experts) give the per-token signal",
        summary="MOPD: on the student's own samples, each token's advantage is −(lp_student − lp_teacher of the "
                "prompt's domain), REINFORCE-style; the pipeline adds Merge (task vectors) and Mix RL (pooled data), "
                "reported per domain",
        status="not registered: work in progress, untested",
        not_established="that a student inherits each teacher's capability; similar averages do not mean per-domain "
                        "equivalence (reports stay per domain)",
        unconfirmed=("title and id (not found)", "the exact MOPD signal (the negated per-token log-ratio to the teacher "
                     "here)", "teachers '' = frozen copies of the initial policy (a plumbing default; the pipeline "
                     "passes trained experts)"),
        confirmed="Merge invariants (base [1, 1], experts [2, 1] and [1, 3] at α = 0.5 -> [1.5, 2.0]; one expert at "
                  "α = 1 returns it; layout or vocabulary mismatch refused), to be tested",
    ),
    source=pipelines.WITH_DOMAINS, round_=(pipelines.TEACHER_LOGPROBS, DOMAIN_METRICS), advantage=pipelines.MOPD,
    objective=losses.REINFORCE, aggregation="token_mean",
    params=(Param("teachers", str, "", "domain teachers, 'domain=PATH,...' (save_pretrained or checkpoint "
                  "directories); a domain not named: a frozen copy of the initial policy"),),
    model=(Stage("model", _build_teachers, name="build_teachers"),),
    state=(StateSpec("teachers", _teachers, params=("teachers",), doc="the frozen domain teachers (never stored)"),),
    kl_placements=("loss",), checks=(on_policy_only("fusion's MOPD loss is REINFORCE-style (no ratio)"),),
))
