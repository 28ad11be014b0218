"""Do the graded judges give range_grpo and gprl something to work with on the real model?

    .venv/bin/python benchmarks/graded_signal.py [--prompts 16] [--group 4]

Samples the arithmetic task's training prompts with SmolLM2-135M-Instruct (the same
settings as benchmarks/methods_real.py: 12 new tokens, temperature 1) and reports, per
group, which reward dimensions (correct, closeness, terse) vary inside it, and how many
pairs of interval rewards are determinate (l_i > u_j) or undetermined. A dimension that is
constant inside a group adds nothing to gprl there; a group whose pairs are all
undetermined gives range_grpo zero advantages. Writes benchmarks/results/graded_signal.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from policylab.trainer.config import config_from_dict
from policylab.kernels.rewards.graded import numeric_interval, reward_vectors
from policylab.trainer.loop import Trainer

RESULTS = Path(__file__).parent / "results"
DIMS = ["correct", "closeness", "terse"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as d:
        cfg = config_from_dict({
            "method": "gprl", "model": "embedded", "run_dir": d, "seed": 0,
            "rollout": {"prompts_per_step": args.prompts, "group_size": args.group, "max_new_tokens": 12},
            "train": {"steps": 1}, "log": {"tensorboard": False, "progress": False}})
        tr = Trainer(cfg)
        examples = tr.task.next_train(args.prompts)
        prompts = [tr.encode(e.prompt) for e in examples]
        batch = tr.rollout.generate(prompts, group_size=args.group, sampling=tr.context().sampling,
                                    max_new_tokens=12, policy_version=0, batch_id="graded-signal")
    texts = tr.rollout.decode(batch)
    answers = [e.answer for e in examples for _ in range(args.group)]
    vec = reward_vectors(texts, answers, DIMS)
    iv = numeric_interval(texts, answers)
    varies = {name: 0 for name in DIMS}
    only = {name: 0 for name in DIMS}  # groups where this dimension is the only one that varies
    determinate = undetermined = 0
    groups_with_determinate = 0
    G = args.group
    for g in range(args.prompts):
        rows = slice(g * G, (g + 1) * G)
        moving = [name for j, name in enumerate(DIMS) if float(vec[rows, j].std(unbiased=False)) > 0]
        for name in moving:
            varies[name] += 1
        if len(moving) == 1:
            only[moving[0]] += 1
        lo, hi = iv[rows, 0], iv[rows, 1]
        det = sum(int(lo[i] > hi[j] or lo[j] > hi[i]) for i in range(G) for j in range(i + 1, G))
        pairs = G * (G - 1) // 2
        determinate += det
        undetermined += pairs - det
        groups_with_determinate += det > 0
    corr = torch.corrcoef(vec.T.float()).nan_to_num(0.0)
    out = {"prompts": args.prompts, "group_size": args.group, "dimension_means": vec.mean(0).tolist(),
           "groups_where_dimension_varies": varies, "groups_where_only_it_varies": only,
           "dimension_correlation": corr.tolist(), "interval_pairs_determinate": determinate,
           "interval_pairs_undetermined": undetermined, "groups_with_a_determinate_pair": groups_with_determinate,
           "interval_width_mean": float((iv[:, 1] - iv[:, 0]).mean()), "sample_replies": texts[: 2 * G]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "graded_signal.json").write_text(json.dumps(out, indent=2, ensure_ascii=False))
    lines = ["# Graded judges on SmolLM2-135M-Instruct: is there signal for gprl and range_grpo?", "",
             f"Command: `.venv/bin/python benchmarks/graded_signal.py --prompts {args.prompts} --group {args.group}`; "
             "arithmetic training prompts (single-digit + and x), 12 new tokens, temperature 1, seed 0, base model.",
             "", "| dimension | mean | groups where it varies | groups where only it varies |", "|---|---|---|---|"]
    for j, name in enumerate(DIMS):
        lines.append(f"| {name} | {out['dimension_means'][j]:.3f} | {varies[name]} / {args.prompts} | "
                     f"{only[name]} / {args.prompts} |")
    lines += ["", "Correlation between the dimensions (rows and columns: " + ", ".join(DIMS) + "): "
              + "; ".join("[" + ", ".join(f"{x:.2f}" for x in row) + "]" for row in out["dimension_correlation"]),
              "", f"Interval rewards: {determinate} determinate and {undetermined} undetermined pairs within groups; "
              f"{groups_with_determinate} of {args.prompts} groups have at least one determinate pair (nonzero "
              f"range_grpo advantages); mean interval width {out['interval_width_mean']:.3f}."]
    (RESULTS / "graded_signal.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
