"""Batches policylab's own trainer makes for a method (tiny random Llama, fp64), for the
round-extension equality tests: the batch after collection (source, reward stages,
filters) and the sampling-time role passes, i.e. what an engine's batch holds when the
extension runs; and policylab's reference loss on it after the trainer's own round."""

from __future__ import annotations

import copy

import torch

from policylab.backends.update import plan_step
from policylab.experiments.exercise import exercise_settings
from policylab.integrations import rounds
from policylab.methods import get
from policylab.methods.loss import loss_terms, term_masks
from policylab.methods.spec import LossInputs
from policylab.kernels import aggregate as agg
from policylab.trainer.loop import Trainer

from trainer_utils import tiny_config

FORCED = ("kl_coef", "entropy_coef")
# groups that keep their rows (ERILS rejects external rows above its length cap; with the
# default group of 2 every group here kept one native row)
SETTINGS = {"erils": {"rollout": {"group_size": 4, "prompts_per_step": 2}}}
PARAMS = {"erils": {"external_max_new_tokens": 4}}  # within the cap: external rows are kept
VOTES = {"ttpo"}  # self-voting methods: the random model writes no numbers, so give the vote some (as test_same_update)


def vote_texts(tr) -> None:
    """Group g's replies read (g, g, g, g + 1): a majority of three and one dissent."""
    def decode(batch):
        return [str(int(g) + (1 if i % 4 == 3 else 0)) for i, g in enumerate(batch.group.tolist())]

    tr.rollout.decode = decode  # the engines compute these terms themselves (hosted with 0)


def trainer_and_batch(name: str, model_dir, workdir, params: dict | None = None):
    """(trainer, batch before the round) for method `name` under its exercise settings."""
    ex = {k: dict(v) for k, v in exercise_settings(name, model=str(model_dir), workdir=workdir / "prep").items()}
    mp = {**ex.pop("method_params", {}), **PARAMS.get(name, {}), **(params or {})}
    declared = {q.name for q in get(name).params}
    mp.update({k: 0.0 for k in FORCED if k in declared})
    train = {"dtype": "fp64", "grad_clip": 0.0, "shared_prefix": False, **ex.pop("train", {})}
    for k, v in SETTINGS.get(name, {}).items():
        ex[k] = {**ex.get(k, {}), **v}
    cfg = tiny_config(model_dir, workdir / "run", method=name, method_params=mp, train=train, **ex)
    tr = Trainer(cfg)
    if name in VOTES:
        vote_texts(tr)
    batch, _ = tr.collect()
    if batch is None:
        raise AssertionError(f"policylab's trainer collected no trainable batch for `{name}` here")
    return tr, tr.prepare(batch)


def user_columns(method, batch) -> dict[str, torch.Tensor]:
    """The policylab columns a user's rows bring into the engine's batch: what the source
    and the reward stages wrote (not what the engine holds itself)."""
    wanted = {w for s in (method.source, *method.rewards) for w in s.writes} - {"tokens", "loss_mask", "rewards"}
    if method.source.name != "on_policy":
        wanted |= {"producer", "source"}
    out = {}
    for k, v in rounds.to_columns(method, batch, with_norms=False).items():
        f = k[len(rounds.PREFIX):].replace("extras0.", "extras.").replace("outcome0.", "outcome.")
        if f in wanted:
            out[k] = v
    return out


def reference(tr, batch, seed: int = 7):
    """policylab's own trainer on `batch`: its round (`Trainer.round_inputs`, the method's
    state copied first), the step's normalizers (`plan_step`) and the loss terms on the
    whole batch at log-probs `logp` (a leaf near logp_old). Returns (loss, grad, logp,
    round batch, advantages, state before the round)."""
    state = copy.deepcopy(tr.controllers)
    rb, A, _ = tr.round_inputs(batch)
    m = tr.method
    g = torch.Generator().manual_seed(seed)
    base = rb.logp_old if rb.logp_old is not None else (rb.logp_behavior if rb.logp_behavior is not None
                                                        else torch.full(rb.loss_mask.shape, -1.0, dtype=torch.float64))
    # a single on-policy update (no old pass) of a method reading logp_current: the learner's
    # log-probs then equal logp_current in value (the engine's old pass is that forward)
    noise = 0.0 if rb.logp_old is None and rb.logp_current is not None else 0.2
    if noise == 0.0:
        base = rb.logp_current
    logp = (base.double() + noise * torch.randn(base.shape, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    logp = torch.where(rb.loss_mask, logp, torch.zeros((), dtype=torch.float64)).requires_grad_()
    plan = plan_step(m, rb, A.adv, skip_zero_adv=False)
    ent = None
    if any("entropy" in s.reads for k in ("objective", "correction", "term") for s in m.active(k)):
        ent = (0.5 + logp.abs()).clone()
    inp = LossInputs(logp=logp, logp_old=rb.logp_old if rb.logp_old is not None else logp.detach(),
                     logp_behavior=rb.logp_behavior, logp_ref=rb.logp_ref, adv=A.adv, mask=rb.loss_mask, entropy=ent,
                     batch=rb)
    terms, _ = loss_terms(m, inp)
    masks = term_masks(m, rb)
    loss = sum(agg.aggregate(terms[k], masks[k][0], masks[k][1], normalizer=plan.norms[k], L_norm=masks[k][2])
               for k in terms if plan.norms[k] != 0.0)
    grad, = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, logp.detach(), rb, A, state
