"""TTRL: majority-vote pseudo-labels as rewards on unlabeled prompts.

Paper: "TTRL: Test-Time Reinforcement Learning", arXiv 2504.16084. For each prompt, N
sampled answers vote; the most frequent extracted answer â is the pseudo-label and each
sample gets r_i = 1[ans_i ≡ â]; the rewards then feed `grpo` advantages.

Library decisions (conventions rule 10), not from the paper:
- Unparseable outputs (extractor returns None) form a `none` bucket that is counted in
  the group size but can never be the label: a group where "no answer" is most common
  still takes its label from the parseable answers.
- A tie for the most votes makes the prompt ineligible this round (no label). Tie-break
  by order or randomness would let sampling noise pick the label.
- A group with no parseable answer at all is ineligible.
- Rewards of ineligible groups are NaN, not 0: training on them without applying the
  returned `eligible` mask fails at the next finite check instead of silently pushing
  every sample of an unlabeled prompt down.

No function here takes a gold answer (rule 7). `pseudo_label_agreement` is for the
evaluator, which holds gold and runs in a separate path after adaptation.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape, group_index
from policylab.errors import ShapeError
from policylab.kernels.rewards.verifiers import extract_last_number

Normalizer = Callable[[str], "str | None"]


def majority_vote(
    votes: Sequence[str | None], *, normalize: Normalizer | None = None
) -> tuple[str | None, dict]:
    """Majority label of one group of extracted answers, or None if there is none.

    Args:
        votes: the answers extracted from one prompt's samples; None = unparseable. (Named
            `votes`, not `answers`, because `answers` means gold everywhere else.)
        normalize: optional output-side equivalence rule applied to every non-None answer
            before counting (e.g. strip units, canonicalize "07" -> "7"); it may return
            None to send an answer to the `none` bucket. It never sees a gold answer.

    Returns:
        (label, info): label is the unique most frequent normalized answer, or None when
        every answer is None or the top count is tied. info has `counts` (dict answer ->
        votes, `none` bucket excluded), `n` (group size), `n_none`, `top_count` (0 if no
        parseable answer), `tie` (bool) and `normalized` (the per-sample normalized answers).
    """
    normalized = []
    for a in votes:
        if a is not None and not isinstance(a, str):
            raise TypeError(f"votes must be str or None, got {type(a).__name__}: {a!r}")
        normalized.append(normalize(a) if (a is not None and normalize is not None) else a)
    counts = Counter(a for a in normalized if a is not None)
    ranked = counts.most_common()
    top = ranked[0][1] if ranked else 0
    tie = len(ranked) > 1 and ranked[1][1] == top
    label = ranked[0][0] if ranked and not tie else None
    info = {
        "counts": dict(counts),
        "n": len(normalized),
        "n_none": sum(a is None for a in normalized),
        "top_count": top,
        "tie": tie,
        "normalized": normalized,
    }
    return label, info


def ttrl_rewards(
    completions: Sequence[str],
    group: Sequence[int] | torch.Tensor,
    *,
    extract: Callable[[str], str | None] = extract_last_number,
    normalize: Normalizer | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Majority-vote rewards `[B]` for unlabeled prompts (no gold argument, by design).

        â_g = majority_vote({normalize(extract(y_i)) : group_i = g});  r_i = 1[ans_i = â_g]

    Args:
        completions: `[B]` sampled replies.
        group: `[B]` prompt ids (arbitrary, unsorted integers); samples of one prompt share one.
        extract: reply -> answer string or None (default: last number in the reply).
        normalize: output-side equivalence rule, see `majority_vote`.

    Returns:
        rewards: `[B]` float (default dtype), 1.0 / 0.0 for eligible groups, NaN for
            ineligible ones (tie or no parseable answer; see module docstring).
        eligible: `[B]` bool, True = the sample's group has a label (over sequences).
        info: `labels` (list per group, in order of sorted group id), `n_groups`,
            `n_eligible`, `n_ties`, `n_no_answer` (ints) and `majority_fraction` (0-dim
            tensor: mean over eligible groups of top votes / group size; NaN if none).
    """
    if isinstance(completions, str):
        raise TypeError("`completions` must be a list of str, got a single str")
    if len(completions) == 0:
        raise ShapeError("`completions` is empty")
    group_t = torch.as_tensor(group)
    dense, n_groups = group_index(group_t, n=len(completions))
    extracted = [extract(c) for c in completions]
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for i, g in enumerate(dense.tolist()):
        members[g].append(i)
    rewards = torch.full((len(completions),), float("nan"))
    labels, fractions, n_ties, n_no_answer = [], [], 0, 0
    for idx in members:  # a loop over strings, not a tensor kernel
        label, info = majority_vote([extracted[i] for i in idx], normalize=normalize)
        labels.append(label)
        n_ties += int(info["tie"])
        n_no_answer += int(info["top_count"] == 0)
        if label is not None:
            fractions.append(info["top_count"] / info["n"])
            for i, a in zip(idx, info["normalized"]):
                rewards[i] = float(a == label)
    eligible = ~torch.isnan(rewards)
    info = {
        "labels": labels,
        "n_groups": n_groups,
        "n_eligible": sum(lab is not None for lab in labels),
        "n_ties": n_ties,
        "n_no_answer": n_no_answer,
        "majority_fraction": torch.tensor(sum(fractions) / len(fractions) if fractions else float("nan")),
    }
    return rewards, eligible, info


def pseudo_label_agreement(
    pseudo_rewards: torch.Tensor, true_rewards: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Evaluator-only: fraction of samples whose pseudo reward equals the true reward.

    `true_rewards` come from gold answers, so call this only in the evaluation path, after
    adaptation, never inside training. `mask` (bool `[B]`, True = counts; pass the
    `eligible` mask of `ttrl_rewards`) restricts the comparison; NaN pseudo rewards outside
    the mask are allowed, inside it they raise. Returns a detached 0-dim tensor.
    """
    check_same_shape("pseudo_rewards", pseudo_rewards, true_rewards=true_rewards, mask=mask)
    if pseudo_rewards.dim() != 1:
        raise ShapeError(f"`pseudo_rewards` must be [B], got {tuple(pseudo_rewards.shape)}")
    if mask is None:
        mask = torch.ones_like(pseudo_rewards, dtype=torch.bool)
    check_mask(mask, "mask")
    check_finite(pseudo_rewards, "pseudo_rewards", mask)
    check_finite(true_rewards, "true_rewards", mask)
    if not bool(mask.any()):
        raise ShapeError("`mask` selects no sample: agreement is undefined")
    dtype = pseudo_rewards.dtype if pseudo_rewards.is_floating_point() else torch.get_default_dtype()
    agree = (pseudo_rewards == true_rewards) & mask
    return (agree.sum() / mask.sum()).to(dtype).detach()
