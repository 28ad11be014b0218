"""Registered pipeline methods: the PPO stage of InstructGPT's three-stage RLHF
(`ppo_rlhf`; the whole pipeline, SFT -> reward model -> PPO, is `policylab pipeline
ppo_rlhf CONFIG`, `policylab.pipelines.rlhf`) and the MOPD route of the fusion paradigms
(`fusion`; Merge, Mix RL and MOPD with per-domain reports are `policylab pipeline fusion
CONFIG`, `policylab.pipelines.fusion`).

Both are ordinary methods of the trainer: `ppo_rlhf` is PPO with GAE whose reward is a
frozen reward model's score once at the last valid token minus the per-token KL penalty
β·(lp_old − lp_ref) (the generic KL-in-reward round stage, read from the sampler's
log-probs); `fusion` is a REINFORCE-style loss whose per-token advantage comes from the
teacher of each prompt's domain.
"""

from __future__ import annotations

from policylab.kernels.mixed import MOPD_HORIZONS
from policylab.methods.params import clip, on_policy_only, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import Card, CriticSpec, Param, StateSpec, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import losses, pipelines, rewards
from policylab.methods.stages.provenance import DOMAIN_METRICS

_UNIT = lambda v: None if 0 <= v <= 1 else "must be in [0, 1]"  # noqa: E731


register(policy_gradient_method(
    "ppo_rlhf",
    Card(
        title="Training language models to follow instructions with human feedback", arxiv="2203.02155",
        family="pipeline (SFT -> reward model -> PPO)",
        samples="π_old: the policy at the current weights, initialized from the SFT checkpoint (stage 1)",
        learns="π_θ; critic V_φ (value head on a copy of the SFT policy)",
        reference="π_ref = the SFT policy (the run's initial weights): per-token KL in the reward, β·(lp_old − lp_ref)",
        critic="value head on a copy of the policy backbone (the SFT weights), clipped value loss; the paper "
               "initializes the value function from the reward model (not done here: library decision)",
        summary="stage 3 of InstructGPT: PPO with GAE whose per-token reward is −β·(lp_old − lp_ref) at every counted "
                "token plus a frozen reward model's score r_ψ(x, y) once at the last counted token; stages 1 (SFT on "
                "demonstrations) and 2 (pairwise reward model on ranked comparisons) run in `policylab pipeline "
                "ppo_rlhf CONFIG`",
        not_established="human preference data, reward-model quality at scale or an RLHF result: the preferences are "
                        "procedural (a known score of the reply: correct and terse beats correct and verbose beats "
                        "wrong), the RM sees a few hundred pairs of four reply templates; clipping and the reference "
                        "KL do not prevent reward hacking",
        unconfirmed=("β = 0.02, γ = 1, λ = 0.95 as the paper's PPO settings (not re-checked against its appendix)",
                     "pretraining mix (PPO-ptx, γ_ptx) not implemented: off, as in the paper's plain PPO runs",
                     "the critic starts from the SFT policy, not from the reward model"),
        confirmed="RM loss −log σ(r_w − r_l) averaged over the C(K, 2) ordered pairs of a prompt, all pairs of a prompt in "
                  "one batch element (the paper's Eq. 1; equal scores give log 2 = 0.6931, swapping winner and loser "
                  "flips the margin: tested); the RL reward is the RM score at the end minus the per-token KL to the SFT "
                  "policy (the paper's Eq. 2 without the ptx term): the score is added once per sequence at the last "
                  "counted token, the KL reads the sampler's lp_old (a learner-side lp that requires grad is refused), "
                  "replacing π_ref changes only the shaped reward and replacing the learner's lp only the ratios "
                  "(tested; lp_old is both the ratio's denominator and the sampler the KL reads); the RM is frozen (no "
                  "optimizer group, no gradient) and its weights are fingerprinted in checkpoints (tested)",
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
              "(a random head on a copy of the initial policy: plumbing tests only); '' is refused")),
    kl=(0.02, "k1", "reward"), kl_placements=("reward",), critic=CriticSpec(clip_param="value_clip"),
    model=(pipelines.REWARD_MODEL,),
    state=(StateSpec("reward_model", pipelines.reward_model_state, params=("reward_model",),
                     doc="the frozen reward model, rebuilt from its directory (checkpointed as its spec and a weight "
                         "fingerprint, never its weights)"),),
    exercise={"method_params": {"reward_model": "untrained"}},
))


register(policy_gradient_method(
    "fusion",
    Card(
        title="Consolidating RLVR Capabilities Across Domains: A Deep Dive into Fusion Paradigms", arxiv="",
        family="pipeline (Merge / Mix RL / MOPD)",
        samples="the student (the learner) on prompts pooled from several task domains, each row tagged with its domain",
        learns="the student π_θ",
        reference="the domain teachers (frozen RL experts, one per domain) give the per-token signal; no KL anchor",
        summary="MOPD: on the student's own samples, each token's advantage is −(lp_student − lp_teacher) under the "
                "teacher of the prompt's domain (mopd_horizon 'token'), or its sum over the rest of the response "
                "('sequence'), in a REINFORCE-style loss; the pipeline adds Merge (task-vector arithmetic) and Mix RL "
                "(ordinary RL on pooled data) and reports every route per domain",
        not_established="that a student inherits each teacher's capability, or that one route is better; similar "
                        "averages do not mean per-domain equivalence (every report and log is per domain)",
        unconfirmed=("title and arXiv id (not found)",
                     "the exact MOPD signal: the negated per-token log-ratio to the domain teacher, with the horizon an "
                     "explicit parameter (mopd_horizon)",
                     "teachers '' = frozen copies of the initial policy (a plumbing default; the pipeline passes the "
                     "trained experts)"),
        confirmed="Merge: θ = θ_base + Σ_k α_k (θ_k − θ_base); base [1, 1], experts [2, 1] and [1, 3] at α = 0.5 each "
                  "give [1.5, 2.0]; one expert at α = 1 returns it; another layout or vocabulary is refused (tested); "
                  "MOPD's student samples, the teacher of each row's domain scores them, a teacher equal to the student "
                  "gives zero advantages (tested)",
    ),
    source=pipelines.WITH_DOMAINS, round_=(pipelines.TEACHER_LOGPROBS, DOMAIN_METRICS), advantage=pipelines.MOPD,
    objective=losses.REINFORCE, aggregation="token_mean",
    params=(Param("teachers", str, "", "domain teachers, 'domain=PATH,...' (save_pretrained or policylab checkpoint "
                  "directories); a domain not named: a frozen copy of the initial policy"),
            Param("mopd_horizon", str, "token", "MOPD signal: 'token' (A_t = −(lp_t − lp_teacher,t), the per-token "
                  "reverse-KL estimate) or 'sequence' (its sum from t to the end of the response); unconfirmed",
                  choices=MOPD_HORIZONS)),
    model=(pipelines.TEACHERS,),
    state=(StateSpec("teachers", pipelines.teachers_state, params=("teachers",),
                     doc="the frozen domain teachers (checkpointed as their specs and weight fingerprints)"),),
    kl_placements=("loss",), checks=(on_policy_only("fusion's MOPD loss is REINFORCE-style (no ratio)"),),
    exercise={"task": {"name": "mixture"}},
))
