"""TASCO: test-time adaptation through a soft prefix of m virtual tokens in front of a
frozen model, tuned for confidence and for stability under K perturbed copies of the
prefix (the prefix-injection path is `policylab.models.soft_prefix`; the loss is
`policylab.kernels.testtime.tasco`). Like the other test-time methods it reads no gold
answer (conventions rule 7) and its report says "adapted" with its budgets.
"""

from __future__ import annotations

import torch

from policylab.batch import LEARNER, concat_batches
from policylab.errors import PolicylabError
from policylab.kernels.testtime import tasco as TA
from policylab.kernels.testtime.tasco import DIVERGENCES
from policylab.methods.context import Sampled, StageContext
from policylab.methods.families.self_labels import (
    ADAPTATION,
    AGREEMENT_DIAGNOSTIC,
    FAMILY,
)
from policylab.methods.param_types import at_least_one
from policylab.methods.params import policy_gradient_method
from policylab.methods.registry import register
from policylab.methods.spec import (
    Advantages,
    Card,
    LossInputs,
    Param,
    Stage,
    StateSpec,
    non_negative,
    positive,
)
from policylab.models.soft_prefix import attach_prefix

# ----------------------------------------------------------------------------- TASCO


class PrefixState:
    """TASCO's per-run state: the seeded generator of the perturbations ξ (checkpointed)
    and the layout of the virtual prefix ids (vocabulary size V, prefix length m, K),
    recorded by the model stage when the run is built."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(int(seed) + 31)
        self.vocab = self.m = self.n_perturb = None

    def block(self, k: int) -> list[int]:
        if self.vocab is None:
            raise PolicylabError("tasco: the soft prefix was not attached (the SOFT_PREFIX model stage runs first)")
        start = self.vocab + k * self.m
        return list(range(start, start + self.m))

    def state_dict(self) -> dict:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["state"])


def soft_prefix(model, setup):
    """Freeze the backbone, wrap it with the soft prefix (`testtime.attach_prefix`), draw
    the first perturbations from the method's generator and record the id layout."""
    p, st = setup.p, setup.state["tasco_prefix"]
    lm = attach_prefix(model, setup.tokenizer, init_text=p.tasco_init_text, n_perturb=p.tasco_perturbations)
    lm.embedding.redraw(st.generator, p.tasco_sigma)
    st.vocab, st.m, st.n_perturb = lm.embedding.vocab, lm.embedding.m, lm.embedding.n_perturb
    return lm


def tasco_source(n_prompts: int, ctx: StageContext) -> Sampled:
    """G replies per prompt sampled under the prefix P (block 0 in front of each prompt),
    then K copies of every reply with block k (P + ξ_k) in front: the same tokens,
    re-scored under the perturbed prefix by the training forward. Copies are not samples:
    source "perturbed", the behavior log-probs of the clean reply (the policy that emitted
    the tokens), extras tasco_copy (k) and tasco_pair (the clean reply's id)."""
    st = ctx.state["tasco_prefix"]
    examples = ctx.next_train(n_prompts)
    prompt_ids = [st.block(0) + ctx.encode(e.prompt) for e in examples]
    G = ctx.run.group_size
    batch = ctx.rollout.generate(prompt_ids, group_size=G, sampling=ctx.sampling, max_new_tokens=ctx.run.max_new_tokens,
                                 policy_version=ctx.policy_version, batch_id=ctx.batch_tag,
                                 group_ids=ctx.new_groups(n_prompts))
    texts = ctx.rollout.decode(batch)
    B = batch.size
    pair = batch.group * G + torch.arange(B) % G
    parts = [batch.replace(extras={**batch.extras, "tasco_copy": torch.zeros(B, dtype=torch.long), "tasco_pair": pair})]
    P = batch.prompt_width
    for k in range(1, st.n_perturb + 1):
        tokens = batch.tokens.clone()
        head = tokens[:, :P]
        tokens[:, :P] = torch.where(head >= st.vocab, head + k * st.m, head)
        parts.append(batch.replace(tokens=tokens, source=("perturbed",) * B, producer=(LEARNER,) * B,
                                   extras={**batch.extras, "tasco_copy": torch.full((B,), k, dtype=torch.long),
                                           "tasco_pair": pair}))
    full = concat_batches(parts, batch.batch_id).validate()
    K1 = st.n_perturb + 1
    return Sampled(full, texts * K1, [e for e in examples for _ in range(G)] * K1, prompt_ids, list(examples))


def no_advantage(batch, ctx: StageContext) -> Advantages:
    """TASCO's loss is not a policy gradient: it has no advantage (identically 0, unread)."""
    return Advantages(TA.no_advantage(batch.size, batch.logp_behavior.dtype))


def tasco_objective(inp: LossInputs, p):
    ex = inp.batch.extras
    if inp.entropy is None or "tasco_copy" not in ex:
        raise PolicylabError("tasco needs the learner's entropy and the perturbed copies of its source")
    return TA.tasco_loss(inp.logp, inp.entropy, inp.mask, ex["tasco_copy"], ex["tasco_pair"], lam=p.tasco_lambda,
                         n_perturb=p.tasco_perturbations, divergence=p.tasco_divergence)


def redraw_perturbations(model, ctx: StageContext) -> dict:
    """After every optimizer step: new perturbations ξ from the method's generator."""
    if not ctx.p.tasco_redraw:
        return {}
    model.embedding.redraw(ctx.state["tasco_prefix"].generator, ctx.p.tasco_sigma)
    return {"tasco/prefix_norm": float(model.embedding.prefix.detach().norm())}


SOFT_PREFIX = Stage("model", soft_prefix, learner=True, kernels=(attach_prefix,),
                    params=("tasco_init_text", "tasco_perturbations", "tasco_sigma"))
TASCO_SOURCE = Stage("source", tasco_source, params=("tasco_perturbations",),
                     writes=("tokens", "loss_mask", "logp_behavior", "group", "policy_version", "source",
                             "extras.tasco_copy", "extras.tasco_pair"))
NO_ADVANTAGE = Stage("advantage", no_advantage, name="none", kernels=(TA.no_advantage,))
TASCO_OBJECTIVE = Stage("objective", tasco_objective, name="tasco", kernels=(TA.tasco_loss,),
                        params=("tasco_lambda", "tasco_perturbations", "tasco_divergence"),
                        reads=("logp", "entropy", "extras.tasco_copy", "extras.tasco_pair"), row_coupling="group")
REDRAW = Stage("poststep", redraw_perturbations, name="redraw_perturbations",
               params=("tasco_redraw", "tasco_sigma"))


# ----------------------------------------------------------------------------- registration

register(policy_gradient_method(
    "tasco",
    Card(
        title="Beyond Confidence: Stability-Aware Test-Time Adaptation for LLM Reasoning", arxiv="", family=FAMILY,
        samples="the frozen model with the soft prefix P, G replies per unlabeled prompt (HF generate through the "
                "prefix: the FastEngine runs plain Llama decoders only)",
        learns="the soft prefix P only (m virtual tokens); the backbone is frozen and bit-identical after adaptation",
        reference="none",
        summary="tune a soft prefix on a frozen model: minimize token entropy (confidence) plus λ × a divergence "
                "between predictions under P and under seeded perturbations P + ξ_k (stability)",
        not_established="stability is not correctness; one prefix is adapted over the stream (not reset per "
                        "input); cost is (K + 1) training forwards per reply, not comparable to best-of-N counts",
        unconfirmed=("arXiv id", "Conf as negative token entropy of the sampled replies", "Instab as a sampled-token "
                     "divergence estimate (k3) between P and P + ξ_k", "perturbations in prefix space, "
                     "ξ ~ N(0, (σ·rms(E))²), σ = 0.1, K = 2, redrawn after every step", "λ = 1",
                     "prefix length and initialization (the embeddings of tasco_init_text's tokens)"),
        confirmed="the title only (the paper's text could not be checked); what is tested is the structure "
                  "L(P) = −Conf + λ·Instab with gradients to P only and a bit-identical frozen backbone",
    ),
    source=TASCO_SOURCE, rewards_=(AGREEMENT_DIAGNOSTIC,), model=(SOFT_PREFIX,), poststep=(REDRAW,),
    advantage=NO_ADVANTAGE, objective=TASCO_OBJECTIVE, aggregation="token_mean", kl_placements=("loss",),
    state=(StateSpec("tasco_prefix", lambda p, seed: PrefixState(seed),
                     doc="the perturbations' seeded generator and the virtual prefix ids"),),
    params=(
        Param("tasco_init_text", str, "Think step by step, then answer.", "the prefix starts as the embeddings of "
              "this text's tokens (its token count is the prefix length m)"),
        Param("tasco_perturbations", int, 2, "K perturbed prefixes P + ξ_k per step", check=at_least_one),
        Param("tasco_sigma", float, 0.1, "perturbation scale: ξ ~ N(0, (σ·s)² I), s = RMS of the embedding rows",
              check=positive),
        Param("tasco_lambda", float, 1.0, "λ: weight of the instability term", check=non_negative),
        Param("tasco_divergence", str, "k3", "per-token divergence estimate between P and P + ξ on the sampled "
              "token (both sides differentiable)", choices=DIVERGENCES),
        Param("tasco_redraw", bool, True, "draw new perturbations after every optimizer step (False: keep the "
              "first draw for the whole run)")),
    report_sections=ADAPTATION,
))
