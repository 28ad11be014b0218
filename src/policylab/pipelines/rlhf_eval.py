"""The ppo_rlhf pipeline's measurements and report: a policy's samples on held-out
prompts scored by the reward model and by the true preference, win rates against the
SFT policy, the RM's agreement with the true preference, and report.md."""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.models.reward_model import RewardModel
import policylab.pipelines.common as common
from policylab.tasks import preferences


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def win_rate(a: list[float], b: list[float]) -> float:
    """P(a_i > b_i) + ½·P(a_i = b_i) over paired samples."""
    if len(a) != len(b) or not a:
        raise PolicylabError(f"win_rate needs two non-empty lists of the same length, got {len(a)} and {len(b)}")
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x, y in zip(a, b)) / len(a)


def rm_agreement(rm_scores: list[float], true: list[float], samples: int) -> dict:
    """How often the RM orders two replies of the same prompt as the true preference does,
    over the pairs of a prompt's samples whose true scores differ (RM ties count ½)."""
    hits = pairs = 0.0
    for start in range(0, len(true), samples):
        for i in range(start, start + samples):
            for j in range(i + 1, start + samples):
                if true[i] == true[j]:
                    continue
                pairs += 1
                d = (rm_scores[i] - rm_scores[j]) * (1 if true[i] > true[j] else -1)
                hits += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
    return {"agreement": hits / pairs if pairs else None, "pairs": int(pairs)}


def policy_eval(model, tokenizer, rm: RewardModel, examples, how: common.Sampling) -> dict:
    """A policy's samples on held-out prompts: RM scores, true-preference scores, accuracy,
    and the RM's agreement with the true preference on these replies."""
    from policylab.kernels.rewards.verifiers import exact_numeric_reward

    b, texts = common.sample(model, tokenizer, examples, how)
    rows = [e for e in examples for _ in range(how.samples)]
    rm_scores = rm.score(b.tokens, b.attention_mask).tolist()
    true = [preferences.true_score(e, t) for e, t in zip(rows, texts)]
    acc = exact_numeric_reward(texts, [e.answer for e in rows])
    return {"rm_score": rm_scores, "true_score": true, "accuracy": sum(acc) / len(acc), "texts": texts[:8],
            "rm_agreement": rm_agreement(rm_scores, true, how.samples),
            "terse_fraction": sum(preferences.is_terse(t) for t in texts) / len(texts)}


def policy_summary(x: dict, comparison: dict) -> dict:
    """One policy's evaluation (policy_eval) as the report gives it; win rates against
    `comparison`, another evaluation of the SFT policy on the same prompts."""
    return {"rm_score_mean": _mean(x["rm_score"]), "true_score_mean": _mean(x["true_score"]),
            "true_preference_win_rate_vs_sft": win_rate(x["true_score"], comparison["true_score"]),
            "accuracy": x["accuracy"], "terse_fraction": x["terse_fraction"],
            "rm_agreement_on_own_replies": x["rm_agreement"]["agreement"],
            "rm_agreement_pairs": x["rm_agreement"]["pairs"], "examples": x["texts"]}


def _f(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def report_markdown(r: dict) -> str:
    ev, st = r["evaluation"], r["stages"]
    b, a = ev["before_ppo"], ev["after_ppo"]
    rm = st["reward_model"]
    lines = [
        f"# ppo_rlhf pipeline ({r['model']}, seed {r['seed']}, {r['seconds']:.0f} s)", "",
        f"- SFT: {st['sft']['steps']} steps on {st['sft']['demonstrations']} solver demonstrations (train split), "
        f"loss {st['sft']['loss_first']:.3f} -> {st['sft']['loss_last']:.3f}",
        f"- reward model: {rm['steps']} steps on {rm['train_pairs']} ranked pairs of {rm['train_prompts']} train "
        f"prompts; held-out pair accuracy {rm['heldout_pair_accuracy']:.3f} over {rm['heldout_pairs']} pairs of "
        f"{rm['heldout_prompts']} held-out prompts (before training: {rm['heldout_pair_accuracy_untrained']:.3f})",
        f"- PPO: {st['ppo'].get('steps', 0)} steps, checkpoint {st['ppo']['checkpoint']}", "",
        f"held-out prompts: {ev['heldout_prompts']} x {ev['samples_per_prompt']} samples (T = 1, "
        f"{ev['max_new_tokens']} new tokens); win rate against the SFT policy's own samples on the same prompts, "
        f"ties 1/2 (standard error about {ev['win_rate_stderr']:.3f}); RM agreement: how often the RM orders two of "
        "the policy's replies to one prompt as the true preference does", "",
        "| policy | RM score | true-preference score | true-preference win rate vs SFT | accuracy | terse | "
        "RM agreement on own replies |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, x in (("before PPO (SFT)", b), ("after PPO", a)):
        lines.append(f"| {name} | {x['rm_score_mean']:.3f} | {x['true_score_mean']:.3f} | "
                     f"{x['true_preference_win_rate_vs_sft']:.3f} | {x['accuracy']:.3f} | {x['terse_fraction']:.3f} | "
                     f"{_f(x['rm_agreement_on_own_replies'])} ({x['rm_agreement_pairs']} pairs) |")
    return "\n".join(lines) + "\n"
