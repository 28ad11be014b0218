"""Registered on-policy methods and their advantage estimators: one `register` each.

Status vocabulary (honest, updated only with evidence, see `evidence.py`):
  "kernel verified"                       unit tests of the math pass (hand cases, naive refs, gradients)
  "+ one trainer step (tiny model)"       the method ran a real optimizer step in the test suite
  "trained end to end on <model>, <task>" a measured run; numbers in the README / benchmarks/results
"""

from __future__ import annotations

from policylab.kernels.advantages import EmaScale
from policylab.errors import PolicylabError
from policylab.methods.params import clip, group_std, max_new_tokens, on_policy_only, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, CriticSpec, Param, StateSpec, non_negative, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import filters, losses, rewards

_GRPO_ROLES = dict(
    samples="rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights",
    learns="π_θ (the only differentiable policy)",
)
_VALUE_CLIP = Param("value_clip", float, 0.2, "clip range ε_v of the value loss around the rollout-time values "
                    "(None: unclipped)", optional=True, check=positive)

register(policy_gradient_method(
    "ppo",
    Card(
        title="Proximal Policy Optimization Algorithms (+ Generalized Advantage Estimation, 1506.02438)",
        arxiv="1707.06347", family="advantage + objective",
        samples="π_old (on-policy rollout at the current weights)", learns="π_θ; critic V_φ (value head on a copy of the policy)",
        reference="π_ref (initial policy) through a per-token KL penalty in the reward (InstructGPT style)",
        critic="value head on a copy of the policy backbone, clipped value loss",
        summary="GAE advantages from a critic, clipped ratio surrogate, clipped value loss; KL to the reference folded into the per-token reward",
        not_established="critic quality; that the clip is a trust region (it bounds the step relative to π_old only, not to π_ref)",
        confirmed="GAE recursion and clipped surrogate as in the papers' equations; value clipping follows common practice (not in the PPO paper)",
    ),
    advantage=adv.GAE, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + (
        Param("gamma", float, 1.0, "discount γ", check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"),
        Param("lam", float, 0.95, "GAE λ", check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"),
        Param("whiten", bool, False, "whiten the advantages over the batch's counted tokens"),
        _VALUE_CLIP),
    kl=(0.05, "k1", "reward"), critic=CriticSpec(clip_param="value_clip"),
))

register(policy_gradient_method(
    "grpo",
    Card(
        title="DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
        arxiv="2402.03300", family="advantage + objective", **_GRPO_ROLES,
        reference="π_ref fixed anchor, k3 KL added to the loss (β = 0.04 in the paper; set kl_coef=0 to drop the reference model)",
        summary="group-standardized outcome reward as every token's advantage; PPO clip; k3 KL in the loss; per-sequence token mean",
        not_established="reasoning gains at scale; the std convention of the paper's code (we expose unbiased/population)",
        confirmed="advantage (r − mean)/std and the k3 estimator as in the paper's eqs. for outcome supervision",
    ),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std(), kl=(0.04, "k3", "loss"), min_group_size=2,
))

register(policy_gradient_method(
    "grpo_process",
    Card(
        title="DeepSeekMath (process-supervision variant of GRPO)", arxiv="2402.03300",
        family="advantage", **_GRPO_ROLES,
        reference="as grpo: π_ref with a k3 KL in the loss (β = 0.04; kl_coef=0 drops it)",
        summary="step rewards normalized over the group's pool; a token's advantage sums the normalized rewards of its step and every later step",
        not_established="PRM quality; tokens after the last step get 0 (library decision)",
        unconfirmed=("advantage of tokens after the last step end",),
        confirmed="GRPO's objective (clip and k3 KL in the loss) with process-supervised advantages, as in the paper",
    ),
    rewards_=(rewards.VERIFIER, rewards.LINE_STEPS),
    advantage=adv.GRPO_PROCESS, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std(), kl=(0.04, "k3", "loss"), kl_placements=("loss",), min_group_size=2,
))

register(policy_gradient_method(
    "dr_grpo",
    Card(
        title="Understanding R1-Zero-Like Training: A Critical Perspective", arxiv="2503.20783",
        family="advantage + aggregation", **_GRPO_ROLES, reference="none (KL off in the paper's main setting)",
        summary="mean-centred group rewards without std division; loss summed over tokens and divided by a constant L_norm",
        not_established="removal of length bias (toy lengths cannot show it)",
        confirmed="A = r − mean_g r and the constant normalizer as in the paper",
    ),
    advantage=adv.DR_GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_sum_norm",
    params=clip(0.2, 0.2) + (Param("L_norm", float, None, "the constant normalizer of the summed token loss "
                                   "(None: the generation budget rollout.max_new_tokens)", optional=True,
                                   check=positive, resolve=max_new_tokens),),
    min_group_size=2,
))

register(policy_gradient_method(
    "dapo",
    Card(
        title="DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arxiv="2503.14476",
        family="objective + filter + shaping", **_GRPO_ROLES, reference="none (KL removed)",
        summary="clip-higher (ε_low 0.2, ε_high 0.28), dynamic sampling on raw correctness, token-mean over the batch, soft overlong penalty",
        not_established="32B-scale results; filtering costs generations and cannot help prompts never solved",
        confirmed="ε_high = 0.28, strict 0 < #correct < G filter, overlong ramp; the paper's L_max = 20480 with "
                  "L_cache = 4096 is the default relation L_cache = 0.2·L_max (L_max: the generation budget)",
    ),
    rewards_=(rewards.VERIFIER, rewards.OVERLONG), filters=(filters.DYNAMIC_SAMPLING,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.28) + group_std() + (
        Param("overlong_max", int, None, "L_max of the soft overlong penalty (None: rollout.max_new_tokens)",
              optional=True, check=positive, resolve=max_new_tokens),
        Param("overlong_cache_frac", float, 0.2, "L_cache = max(1, floor(frac·L_max)); 0.2 = the paper's 4096/20480",
              check=lambda v: None if 0 < v <= 1 else "must be in (0, 1]")),
    min_group_size=2,
))

register(policy_gradient_method(
    "rloo",
    Card(
        title="Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
        arxiv="2402.14740", family="advantage", samples="π_θ at the current weights, K ≥ 2 samples per prompt",
        learns="π_θ", reference="optional: KL-shaped sequence reward (off by default)",
        summary="leave-one-out mean of the other K−1 rewards as baseline; whole response is one action (REINFORCE)",
        not_established="RM quality; large-model RLHF",
        confirmed="A_i = r_i − mean of the others = K/(K−1)·(r_i − mean); REINFORCE has no ratio, so a batch is used "
                  "for exactly one update (several epochs, minibatches or staleness are refused)",
    ),
    advantage=adv.RLOO, objective=losses.REINFORCE, aggregation="seq_mean_token_sum", min_group_size=2,
    checks=(on_policy_only("rloo is plain REINFORCE (no ratio)"),),
))

register(policy_gradient_method(
    "remax",
    Card(
        title="ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large Language Models",
        arxiv="2310.10505", family="advantage", samples="π_θ: one sampled and one greedy response per prompt",
        learns="π_θ (sampled tokens only; greedy tokens never enter the loss)", reference="none",
        summary="reward of the greedy decode of the same prompt is the baseline",
        not_established="memory/latency claims",
        confirmed="A = r(sample) − r(greedy) with the same reward protocol for both; REINFORCE (no ratio), so a batch "
                  "is used for exactly one update",
    ),
    rewards_=(rewards.VERIFIER, rewards.GREEDY_BASELINE),
    advantage=adv.REMAX, objective=losses.REINFORCE, aggregation="seq_mean_token_sum",
    checks=(on_policy_only("remax is plain REINFORCE (no ratio)"),),
))

register(policy_gradient_method(
    "reinforce_pp",
    Card(
        title="REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and Reward Models",
        arxiv="2501.03262", family="advantage", samples="π_old (one sample per prompt allowed)", learns="π_θ",
        reference="π_ref through a per-token KL folded into the return-to-go (KL in the reward; k1 by default)",
        summary="KL-shaped return-to-go, whitened over all tokens of the batch, PPO clip; no critic",
        not_established="robustness claims of the paper",
        unconfirmed=("which revision/title of the paper the library cites",),
        confirmed="A_t = r − β·Σ_{u≥t} KL_u with the k1 estimator, then batch whitening; k2/k3 are offered as explicit "
                  "alternatives of the same per-token penalty",
    ),
    advantage=adv.REINFORCE_PP, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2), kl=(0.01, "k1", "reward"), kl_placements=("reward",),
))


def _ema(p, seed):
    return EmaScale(decay=p.ema_decay)


register(policy_gradient_method(
    "reinforce_pp_baseline",
    Card(
        title="REINFORCE++ (group-baseline variant)", arxiv="2501.03262", family="advantage",
        samples="π_old, G samples per prompt", learns="π_θ", reference="none by default",
        summary="group-mean centring, then one global scale (batch std, or √EMA of the second moment)",
        not_established="EMA decay choices; small tests only check semantics",
        unconfirmed=("EMA decay (ema_decay, default 0.99: library decision)",),
    ),
    advantage=adv.REINFORCE_PP_BASELINE, objective=losses.PPO_CLIP, aggregation="token_mean",
    params=clip(0.2, 0.2) + (
        Param("scale", str, "batch_std", "global scale: the batch std of the centred rewards, or √EMA of their "
              "second moment", choices=("batch_std", "ema")),
        Param("ema_decay", float, 0.99, "decay of the second-moment EMA (scale='ema'), advanced once per training batch",
              check=lambda v: None if 0 < v < 1 else "must be in (0, 1)")),
    state=(StateSpec("ema_scale", _ema, params=("ema_decay",), doc="EMA of the centred rewards' second moment"),),
    min_group_size=2,
))


def _vapo_pretraining(run, p) -> None:
    if p.value_pretrain_steps < 1 and not p.allow_untrained_critic:
        raise PolicylabError(
            "vapo trains the policy against its value model, and value pretraining is the method's defining first "
            "stage: set method_params.value_pretrain_steps >= 1 (default 5), or method_params.allow_untrained_critic="
            "true to train against an untrained critic on purpose")


register(policy_gradient_method(
    "vapo",
    Card(
        title="VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks", arxiv="2504.05118",
        family="objective + advantage (value-based)", samples="π_old, G samples per prompt", learns="π_θ; critic V_φ",
        reference="none", critic="value head on a copy of the policy, pretrained on Monte-Carlo returns",
        summary="value pretraining, decoupled GAE (λ_critic 1, λ_policy = 1 − 1/(α·l)), clip-higher, positive-example NLL",
        not_established="that a short value pretraining gives a good critic; effects need long CoT",
        unconfirmed=("λ_policy for responses shorter than 1/α (clamped to [0, 1], counted: library decision)",
                     "the number of value-pretraining steps (the paper trains until value loss and explained "
                     "variance are low; default 5 steps is a library decision)"),
        confirmed="α = 0.05, ε_high = 0.28, μ_lm = 0.1 as listed in the paper; value pretraining on Monte-Carlo "
                  "returns from the fixed initial policy before any policy update",
    ),
    advantage=adv.VAPO, objective=losses.PPO_CLIP, aggregation="token_mean", terms=(losses.POSITIVE_NLL,),
    params=clip(0.2, 0.28) + (
        Param("alpha", float, 0.05, "α of λ_policy = 1 − 1/(α·l)", check=positive),
        Param("lam_critic", float, 1.0, "λ of the critic's GAE targets", check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"),
        Param("gamma", float, 1.0, "discount γ", check=lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"),
        _VALUE_CLIP,
        Param("nll_coef", float, 0.1, "μ_lm of the positive-example NLL (0: off)", check=non_negative),
        Param("value_pretrain_steps", int, 5, "critic-only steps on batches of the fixed initial policy before any "
              "policy update", check=non_negative),
        Param("allow_untrained_critic", bool, False, "allow value_pretrain_steps = 0 (training the policy against "
              "an untrained critic)")),
    critic=CriticSpec(clip_param="value_clip", pretrain_param="value_pretrain_steps"),
    checks=(_vapo_pretraining,),
))

register(policy_gradient_method(
    "gspo",
    Card(
        title="Group Sequence Policy Optimization", arxiv="2507.18071", family="objective", **_GRPO_ROLES,
        reference="none",
        summary="one length-normalized (geometric-mean) ratio per response, one clip decision per sequence",
        not_established="MoE stability benefits (needs an MoE model)",
        unconfirmed=("clip range: ~3e-4 / 4e-4 scale per the paper; set explicitly",),
    ),
    advantage=adv.GRPO, objective=losses.GSPO, aggregation="seq_mean_token_mean",
    params=clip(3e-4, 4e-4, dual=False) + group_std(), min_group_size=2,
))

register(policy_gradient_method(
    "cispo",
    Card(
        title="MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", arxiv="2506.13585",
        family="objective", **_GRPO_ROLES, reference="none",
        summary="detached clipped IS weight × advantage × logp: no token ever loses its gradient",
        not_established="a trust region (only the weight is bounded)",
        unconfirmed=("ε values: the paper disables the lower bound and tunes the upper one",),
    ),
    advantage=adv.GRPO, objective=losses.CISPO, aggregation="token_mean",
    params=clip(None, 0.28, low_optional=True, dual=False) + group_std(), min_group_size=2,
))

register(policy_gradient_method(
    "gppo",
    Card(
        title="Klear-Reasoner: Advancing Reasoning Capability via Gradient-Preserving Clipping Policy Optimization",
        arxiv="2508.07629", family="objective", **_GRPO_ROLES, reference="none",
        summary="PPO forward values; clipped tokens keep a bounded gradient (1+ε_high or 1−ε_low)",
        not_established="long-CoT claims; loss logs cannot distinguish it from PPO",
    ),
    advantage=adv.GRPO, objective=losses.GPPO, aggregation="token_mean",
    params=clip(0.2, 0.28, dual=False) + group_std(), min_group_size=2,
))

register(policy_gradient_method(
    "ttrl",
    Card(
        title="TTRL: Test-Time Reinforcement Learning", arxiv="2504.16084", family="test-time adaptation",
        samples="π_θ, N answers per unlabeled prompt", learns="π_θ (online)", reference="none",
        summary="majority-vote pseudo-label, 0/1 agreement reward, GRPO; gold only in the separate evaluator",
        not_established="consensus can be confidently wrong; adapted models are not fixed-model evaluations",
        unconfirmed=("tie rule: tied majorities make the prompt ineligible (library decision)",),
    ),
    rewards_=(rewards.MAJORITY_VOTE,), filters=(filters.ELIGIBLE,),
    advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean",
    params=clip(0.2, 0.2) + group_std(), min_group_size=2,
))
