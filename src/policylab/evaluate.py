"""Held-out evaluation: accuracy (pass@1 over all samples), unbiased pass@k, mean length.

Evaluation samples under a forked RNG so it never changes the training run's random
stream (a run with evaluation every N steps trains exactly like one without)."""

from __future__ import annotations

import math

import torch

from .batch import SamplingSettings


def evaluate(engine, prompts: list[list[int]], answers: list[str], reward_fn, *, samples: int = 1,
             k: tuple[int, ...] = (1,), temperature: float = 1.0, max_new_tokens: int = 32,
             batch_size: int = 64, seed: int = 1234, progress=None) -> dict:
    from .metrics import pass_at_k

    n_prompts = len(prompts)
    correct = torch.zeros(n_prompts)
    lengths, total = [], 0
    sampling = SamplingSettings(temperature=temperature)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for start in range(0, n_prompts, batch_size):
            sl = slice(start, min(start + batch_size, n_prompts))
            batch = engine.generate(
                prompts[sl], group_size=samples, sampling=sampling, max_new_tokens=max_new_tokens,
                policy_version=-1, batch_id=f"eval-{start}",
            )
            texts = engine.decode_responses(batch)
            golds = [a for a in answers[sl] for _ in range(samples)]
            r = torch.as_tensor(reward_fn(texts, golds), dtype=torch.float32)
            correct[sl] = r.view(-1, samples).sum(-1)
            lengths.extend(batch.response_lengths.tolist())
            total += len(texts)
            if progress is not None:
                progress(min(start + batch_size, n_prompts), n_prompts)
    out = {
        "n_prompts": n_prompts,
        "samples_per_prompt": samples,
        "accuracy": float(correct.sum() / (n_prompts * samples)),
        "mean_length": sum(lengths) / max(len(lengths), 1),
    }
    for kk in k:
        out[f"pass@{kk}"] = float(pass_at_k(torch.full((n_prompts,), samples), correct, kk).mean())
    # binomial standard error of the accuracy, so readers can judge a difference
    p = out["accuracy"]
    out["accuracy_stderr"] = math.sqrt(max(p * (1 - p), 1e-12) / (n_prompts * samples))
    return out
