"""MaD-RL: reward a group for matching a target distribution over output classes.

Paper: "MaD-RL: Matching Distributions for Calibrating LLMs with Reinforcement Learning"
(arXiv id not confirmed). Each reply is mapped to a class by a deterministic mapper; the
classes of a prompt are its K−1 named outcomes plus an explicit `invalid` class (the last
index) for replies that name none or several. Over the G replies of a group:

    f̂_g(c)   = #{i in g : c_i = c} / G          (invalid replies stay in G; detached)
    p̃*(c)   = (1 − ε)·p*(c) + ε/K               (explicit smoothing ε)
    r^match_i = log(p̃*(c_i) / f̂_g(c_i))         ("log_ratio")  or  p̃*(c_i) − f̂_g(c_i)  ("gap")
    r_i       = correct_i + λ·r^match_i

With "log_ratio" a group's summed match reward is −G·KL(f̂_g ‖ p̃*): the group is paid
for the whole distance, each reply for its own class's share. A class that was not
sampled gets no reward, no fabricated sample and no gradient. f̂ is a frequency of the
sampled batch: detached, a constant of the update (conventions rule 3).

Unconfirmed (explicit arguments): the match term (both forms), ε, λ. A target with a
zero entry and ε = 0 raises (the log ratio of a reply in that class is −∞; the invalid
class usually has p* = 0, so it needs ε > 0 or an explicit target mass).
"""

from __future__ import annotations

import re

import torch

from policylab.kernels.checks import group_index
from policylab.errors import ShapeError

MATCH_FORMS = ("log_ratio", "gap")


def smooth_target(target: torch.Tensor, smoothing: float) -> torch.Tensor:
    """(1 − ε)·p* + ε/K over the last dimension; refuses a target that is not a
    distribution, and a zero entry when ε = 0."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"`smoothing` must be in [0, 1), got {smoothing}")
    if not target.is_floating_point() or target.dim() < 1:
        raise ShapeError(f"`target` must be a float tensor [..., K], got {target.dtype} {tuple(target.shape)}")
    if bool((target < 0).any()) or not torch.allclose(target.sum(-1).double(),
                                                      torch.ones(target.shape[:-1], dtype=torch.float64), atol=1e-6):
        raise ValueError("`target` rows must be non-negative and sum to 1")
    if smoothing == 0.0 and bool((target == 0).any()):
        raise ValueError("`target` has p*(c) = 0 and smoothing is 0: a reply of class c would get log(0); "
                         "set the smoothing epsilon > 0 or give every class (the invalid one too) some mass")
    K = target.shape[-1]
    return (1.0 - smoothing) * target + smoothing / K


def group_frequencies(class_ids: torch.Tensor, group: torch.Tensor, n_classes: int) -> torch.Tensor:
    """[B, K]: each row holds its group's class frequencies f̂_g (count / group size, every
    reply counted, invalid ones too). Detached."""
    if class_ids.dim() != 1 or class_ids.dtype != torch.long:
        raise ShapeError(f"`class_ids` must be long [B], got {class_ids.dtype} {tuple(class_ids.shape)}")
    if bool(((class_ids < 0) | (class_ids >= n_classes)).any()):
        raise ShapeError(f"`class_ids` must be in [0, {n_classes})")
    dense, n_groups = group_index(group, n=class_ids.numel())
    counts = torch.zeros(n_groups, n_classes, dtype=torch.float64)
    counts.index_put_((dense, class_ids), torch.ones(class_ids.numel(), dtype=torch.float64), accumulate=True)
    freq = counts / counts.sum(-1, keepdim=True)
    return freq[dense].detach()


def match_rewards(class_ids: torch.Tensor, group: torch.Tensor, target: torch.Tensor, *, smoothing: float,
                  form: str) -> tuple[torch.Tensor, dict]:
    """r^match [B] and diagnostics. target [B, K] (p* of the row's prompt; rows of a group
    must agree). Returns (r_match, info) with info: `freq` [B, K], `target` (smoothed)
    [B, K], `tv` and `kl` per row (of its group: ½Σ|f̂ − p̃*| and KL(f̂ ‖ p̃*))."""
    if form not in MATCH_FORMS:
        raise ValueError(f"`form` must be one of {MATCH_FORMS}, got {form!r}")
    if target.dim() != 2 or target.shape[0] != class_ids.shape[0]:
        raise ShapeError(f"`target` must be [B, K] with B = {class_ids.shape[0]}, got {tuple(target.shape)}")
    dense, _ = group_index(group, n=class_ids.numel())
    for g in torch.unique(dense):
        rows = target[dense == g]
        if not torch.equal(rows, rows[:1].expand_as(rows)):
            raise ValueError("the rows of one group have different targets")
    p = smooth_target(target.double(), smoothing)
    freq = group_frequencies(class_ids, group, target.shape[1])
    idx = class_ids.unsqueeze(-1)
    p_i, f_i = p.gather(-1, idx).squeeze(-1), freq.gather(-1, idx).squeeze(-1)
    r = torch.log(p_i / f_i) if form == "log_ratio" else p_i - f_i
    nz = freq > 0
    kl = torch.where(nz, freq * torch.log(torch.where(nz, freq, torch.ones_like(freq)) / p), torch.zeros_like(freq)).sum(-1)
    info = {"freq": freq, "target": p, "tv": 0.5 * (freq - p).abs().sum(-1), "kl": kl}
    return r.to(target.dtype).detach(), info


def mad_rl_rewards(correct: torch.Tensor, class_ids: torch.Tensor, group: torch.Tensor, target: torch.Tensor, *,
                   coef: float, smoothing: float, form: str) -> tuple[torch.Tensor, dict]:
    """r_i = correct_i + coef · r^match_i, [B] (detached), and `match_rewards`' info."""
    if correct.shape != class_ids.shape:
        raise ShapeError(f"`correct` must be [B] like `class_ids`, got {tuple(correct.shape)}")
    r_match, info = match_rewards(class_ids, group, target, smoothing=smoothing, form=form)
    info["match"] = r_match
    return (correct.to(r_match.dtype) + coef * r_match).detach(), info


_STRIP = re.compile(r"^[\s\"'`*_.,!:;()\[\]]+|[\s\"'`*_.,!:;()\[\]]+$")
_WORD = re.compile(r"[a-z0-9]+")
MAPPERS = ("exact", "single_mention")


def map_class(reply: str, classes: list[str], mapper: str = "exact") -> int:
    """The deterministic class mapper; anything it cannot map is `invalid` = len(classes).

    exact           the reply, lower-cased and stripped of surrounding whitespace, quotes,
                    markup and punctuation, must equal one class name ("Heads." -> heads;
                    "I got heads" -> invalid)
    single_mention  the reply's words (lower-cased runs of letters and digits) must name
                    exactly one distinct class, any number of times ("The coin lands heads."
                    -> heads; "heads or tails" -> invalid; "tails, tails" -> tails). For
                    chatty models; a reply that restates the prompt's numbers can name a
                    class it did not choose (a die reply "a 4-sided die shows 3": 4 and 3,
                    invalid)."""
    if mapper not in MAPPERS:
        raise ValueError(f"`mapper` must be one of {MAPPERS}, got {mapper!r}")
    names = [c.lower() for c in classes]
    if mapper == "exact":
        text = _STRIP.sub("", reply.strip().lower())
        return names.index(text) if text in names else len(classes)
    if not all(_WORD.fullmatch(n) for n in names):
        raise ValueError(f"mapper 'single_mention' needs one-word class names (letters and digits), got {classes}")
    named = {w for w in _WORD.findall(reply.lower()) if w in names}
    return names.index(named.pop()) if len(named) == 1 else len(classes)


def valid_outcome_reward(completions, answers, *, mapper: str = "exact", **context) -> list[float]:
    """Verifier of the distribution task: 1.0 if the reply names exactly one of the
    allowed outcomes (`answers` hold them as "a|b|c") under `mapper` (`map_class`), else 0.0."""
    out = []
    for reply, allowed in zip(completions, answers):
        classes = allowed.split("|")
        out.append(float(map_class(reply, classes, mapper) < len(classes)))
    return out


valid_outcome_reward.__name__ = "valid_outcome"
