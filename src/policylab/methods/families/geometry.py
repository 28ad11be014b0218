"""Registered gradient-geometry methods: CORD (project the RL gradient off a protected
objective's), GCPO (LoRA updates kept out of the base weights' top-k singular spaces),
ISO (frozen spectra, trained orthonormal frames). Each runs GRPO's advantage and clipped
surrogate as its host and changes only what happens to the gradient or the weights, via
model, grad and poststep stages; none touches the trainer."""

from __future__ import annotations

from policylab.kernels.geometry.cord import MODES, SCOPES
from policylab.kernels.geometry.spectrum import RETRACTIONS
from policylab.methods.params import clip, group_std, policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.retention import SOURCES, RetentionSet
from policylab.methods.spec import Card, Param, StateSpec, non_negative, positive
from policylab.methods.stages import advantages as adv
from policylab.methods.stages import geometry as geo
from policylab.methods.stages import losses

_SAMPLES = "rollout engine at the current weights (G samples per prompt); π_old = trainer recompute at those weights"
_HOST = dict(advantage=adv.GRPO, objective=losses.PPO_CLIP, aggregation="seq_mean_token_mean", kl=(0.0, "k3", "loss"),
             min_group_size=2)
_HOST_PARAMS = clip(0.2, 0.2) + group_std()


def _retention(p, seed: int) -> RetentionSet:
    return RetentionSet(p.retention_size, p.retention_source)


register(policy_gradient_method(
    "cord",
    Card(
        title="CORD: Conflict-Aware Optimization for Joint RL and Distillation in Agents", arxiv="",
        family="gradient-geometry", samples=_SAMPLES + "; the protected objective reads a held retention set built "
        "once from the training split (gold answers, or the base policy's greedy replies)",
        learns="π_θ, with the full-step gradient g = β·g_retention + λ·g_rl', g_rl' projected off g_retention "
               "where they conflict (or always)",
        reference="none in the RL loss by default (kl_coef 0); the retention set's likelihood is the protected "
                  "anchor",
        summary="once per optimizer step, after accumulation: the RL gradient loses its component along the "
                "protected (retention NLL) gradient when the two conflict, then both are summed",
        not_established="that protecting the retention likelihood preserves capabilities on this task; the paper's "
                        "setting (agents, a teacher model's distillation loss) is not reproduced: the protected "
                        "objective here is the NLL of a retention set; AdamW can still hurt the protected objective "
                        "(the guarantee is first order, before the optimizer)",
        unconfirmed=("title, arXiv id (the paper could not be checked)", "which objective the paper protects (protect)",
                     "λ (cord_lambda = 1.0) and the protected weight (protected_weight = 1.0)",
                     "whole-vector vs per-parameter-group projection (cord_scope = global)"),
        confirmed="the specification's projection rule and invariants (hand-worked cases, conflict-only and always, "
                  "λ = 0, the full-step vs per-micro-batch difference): tested; no text of the paper could be checked",
    ),
    **_HOST, grad=(geo.CORD_PROJECT,),
    params=_HOST_PARAMS + (
        Param("cord_mode", str, "conflict_only", "project the other gradient only when ⟨g_other, g_protected⟩ < 0 "
              "(conflict_only) or always", choices=MODES),
        Param("cord_lambda", float, 1.0, "λ, the weight of the non-protected objective's gradient (unconfirmed)",
              check=non_negative),
        Param("cord_scope", str, "global", "project the whole flattened gradient (global) or each parameter tensor "
              "on its own (per_tensor)", choices=SCOPES),
        Param("protect", str, "retention", "which objective is protected: the retention NLL (the RL gradient is "
              "projected) or the RL loss (the retention gradient is projected)", choices=("retention", "rl")),
        Param("protected_weight", float, 1.0, "β, a weight on the retention NLL's gradient before the combination "
              "(library decision; the projection does not depend on it)", check=positive),
        Param("retention_size", int, 8, "examples in the retention set, drawn once from the training stream",
              check=positive),
        Param("retention_source", str, "gold", "retention answers: the examples' gold answers, or the base "
              "policy's greedy replies (base_greedy: distillation from the frozen initial policy)", choices=SOURCES),
    ),
    state=(StateSpec(geo.RETENTION_STATE, _retention, params=("retention_size", "retention_source"),
                     doc="the held retention set (token ids), built at the first optimizer step, checkpointed"),),
))

register(policy_gradient_method(
    "gcpo",
    Card(
        title="GCPO: Diagnosing and Constraining Subspace Geometry in Rollout RL for LLMs", arxiv="2608.11674",
        family="gradient-geometry", samples=_SAMPLES,
        learns="LoRA adapters (train.lora_rank) whose effective update P_L·BA·P_R avoids the top-k left and right "
               "singular spaces of each frozen base weight",
        reference="none by default (kl_coef 0); the frozen base weights' SVDs define what is protected",
        summary="per adapted layer: gradients of B and A projected onto the complements of W_0's top-k singular "
                "spaces before the step, and the factors re-projected after it",
        not_established="the paper's stability, capability-retention and length results (8B/9B models); that k = 8 "
                        "suits a 135M model",
        unconfirmed=("parametrization in the forward (as the paper describes δW = α P_L L R P_R) vs re-projection "
                     "of the factors after each step (here, with projected factor gradients: the same constraint "
                     "on the effective update)", "which layers are adapted (every linear layer here)",
                     "the host objective (GRPO's clipped surrogate here)"),
        confirmed="against the paper's abstract and a summary of its method: hard bilateral orthogonal projection "
                  "onto the complements of the pretrained weight's top-k left and right singular spaces, trainable "
                  "low-rank factors, k = 8 as the paper's best value (its runs: LoRA rank 32, α 16); bilateral beats "
                  "one-sided in its ablation (a one-sided projection fails the bilateral test here)",
    ),
    **_HOST, model=(geo.GCPO_SETUP,), grad=(geo.GCPO_GRADS,), poststep=(geo.GCPO_REPROJECT,),
    params=_HOST_PARAMS + (
        Param("protected_rank", int, 8, "k, the top singular directions of each base weight (left and right) the "
              "update must not touch; needs train.lora_rank <= min(out, in) − k in every layer", check=non_negative),
        Param("project_gradients", bool, True, "also project the factors' gradients before the step (the gradient "
              "of the parametrized update; library decision), not only the factors after it"),
    ),
    exercise={"train": {"lora_rank": 8}},
))

register(policy_gradient_method(
    "iso",
    Card(
        title="ISO: An RLVR-Native Optimization Stack", arxiv="2607.19331",
        family="gradient-geometry", samples=_SAMPLES,
        learns="the orthonormal frames U, V of every targeted linear layer, W = U Σ₀ Vᵀ; Σ₀ frozen (a buffer, in no "
               "optimizer group)",
        reference="none by default (kl_coef 0)",
        summary="targeted linear layers reparametrized by their SVD with the singular values frozen; the optimizer "
                "steps the frames and a retraction puts them back on the Stiefel manifold after every step",
        not_established="the paper's step-efficiency claims; anything of the ISO stack beyond the fixed-spectrum "
                        "optimizer; the reparametrized forward y = ((xV)⊙σ)Uᵀ rounds differently from x·W₀ᵀ (the "
                        "initial policy equals the base model up to fp32 rounding, not bit for bit)",
        unconfirmed=("which layers (iso_targets: every decoder projection; embeddings and the tied head left out)",
                     "free frames with a retraction vs U = U₀R, V = V₀R' with R, R' orthogonal",
                     "whether Newton–Schulz iterations are an acceptable way to the polar factor (same factor, "
                     "fp64, SVD fallback)"),
        confirmed="against a description of the paper (not its full text): the fixed-spectrum family "
                  "{U Σ₀ Vᵀ : U ∈ St(m, q), V ∈ St(n, q)}, q = min(m, n) (its Eq. 2), frame gradients G_U = G_W V Σ₀, "
                  "G_V = G_Wᵀ U Σ₀, a base optimizer step on the frames, then a polar retraction computed in fp64",
    ),
    **_HOST, model=(geo.ISO_SETUP,), poststep=(geo.ISO_RETRACT,),
    params=_HOST_PARAMS + (
        Param("iso_targets", str, "*.self_attn.*_proj,*.mlp.*_proj", "comma-separated glob patterns of the linear "
              "layers to reparametrize (qualified module names)"),
        Param("retraction", str, "polar", "how the frames return to the Stiefel manifold after each step: the "
              "nearest orthonormal frame (polar, the paper's) or QR", choices=RETRACTIONS),
    ),
))
