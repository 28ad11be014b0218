"""Held-out evaluation: accuracy (pass@1 over all samples), unbiased pass@k, mean length;
and the decision-token logits that calibration is measured on (`decision_logits`).

Evaluation samples under a forked RNG so it never changes the training run's random
stream (a run with evaluation every N steps trains exactly like one without). The
coverage and calibration metrics built on these (`policylab eval --metrics`) are in
`policylab.eval.suite`."""

from __future__ import annotations

import math

import torch

from policylab.batch import SamplingSettings


def evaluate(engine, prompts: list[list[int]], answers: list[str], reward_fn, *, samples: int = 1,
             k: tuple[int, ...] = (1,), temperature: float = 1.0, max_new_tokens: int = 32,
             batch_size: int = 64, seed: int = 1234, progress=None, counts: bool = False,
             solved_at: float = 1.0, prompt_texts: list[str] | None = None, task_metrics=None) -> dict:
    """Sample `samples` replies per prompt and score them with `reward_fn` against the
    gold `answers` (the evaluator: the only place gold is read). `counts=True` adds
    "correct_per_prompt", the number of correct samples of each prompt, in order (what
    fixed-budget coverage is computed from).

    A sample is correct when its score is at least `solved_at` (1.0: full credit).
    Verifiers with partial credit (reasoning-gym scorers give e.g. 0.5 for a near miss)
    count as correct only at full credit in accuracy and pass@k; the mean score over all
    samples, partial credit included, is `mean_reward`. A non-finite score is refused
    (it names the reply), never averaged in. `prompt_texts` (the prompts as text, one per
    prompt) reach the verifier as `prompts=`, as in training, so a reply that only echoes
    its prompt is judged the same way in both. `task_metrics(replies, correct)` (the task's
    own held-out measures, e.g. the calibration of a stated confidence) gets every reply and
    whether it was correct, and its dict joins the result."""
    from policylab.errors import PolicylabError
    from policylab.kernels.metrics import pass_at_k

    n_prompts = len(prompts)
    if prompt_texts is not None and len(prompt_texts) != n_prompts:
        raise PolicylabError(f"prompt_texts has {len(prompt_texts)} entries for {n_prompts} prompts")
    correct = torch.zeros(n_prompts)
    lengths, total, score_sum = [], 0, 0.0
    all_texts: list[str] = []
    all_correct: list[bool] = []
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
            context = {} if prompt_texts is None else {"prompts": [q for q in prompt_texts[sl] for _ in range(samples)]}
            r = torch.as_tensor(reward_fn(texts, golds, **context), dtype=torch.float32)
            if r.shape != (len(texts),):
                raise PolicylabError(f"the verifier returned {tuple(r.shape)} scores for {len(texts)} held-out replies")
            bad = (~torch.isfinite(r)).nonzero().flatten().tolist()
            if bad:
                i = bad[0]
                raise PolicylabError(f"the verifier scored {len(bad)} held-out reply(ies) non-finite, e.g. {r[i].item()} "
                                     f"for reply {texts[i]!r} (gold {golds[i]!r}): fix the verifier")
            correct[sl] = (r >= solved_at).view(-1, samples).sum(-1).float()
            if task_metrics is not None:
                all_texts += texts
                all_correct += (r >= solved_at).tolist()
            score_sum += float(r.double().sum())
            lengths.extend(batch.response_lengths.tolist())
            total += len(texts)
            if progress is not None:
                progress(min(start + batch_size, n_prompts), n_prompts)
    out = {
        "n_prompts": n_prompts,
        "samples_per_prompt": samples,
        "accuracy": float(correct.sum() / (n_prompts * samples)),
        "mean_reward": score_sum / max(n_prompts * samples, 1),
        "mean_length": sum(lengths) / max(len(lengths), 1),
    }
    for kk in k:
        out[f"pass@{kk}"] = float(pass_at_k(torch.full((n_prompts,), samples), correct, kk).mean())
    # binomial standard error of the accuracy, so readers can judge a difference
    p = out["accuracy"]
    out["accuracy_stderr"] = math.sqrt(max(p * (1 - p), 1e-12) / (n_prompts * samples))
    if counts:
        out["correct_per_prompt"] = [int(x) for x in correct.tolist()]
    if task_metrics is not None:
        extra = task_metrics(all_texts, all_correct)
        clash = sorted(set(extra) & set(out))
        if clash:
            raise PolicylabError(f"the task's held-out metrics would overwrite {clash}")
        out.update(extra)
    return out


@torch.no_grad()
def decision_logits(model, prompts: list[list[int]], choice_ids: list[int], *, pad_id: int,
                    batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's next-token logits right after each prompt (the first reply token),
    restricted to `choice_ids`: `[N, C]` float64, and the probability mass the full
    next-token distribution puts on those choices `[N]` (how much of the decision the
    restriction keeps). Prompts are left-padded; positions count real tokens only."""
    from policylab.models.logprobs import split_head

    decoder, head, softcap = split_head(model)
    ids = torch.tensor(choice_ids, dtype=torch.long)
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out, mass = [], []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            P = max(len(p) for p in chunk)
            tok = torch.full((len(chunk), P), int(pad_id), dtype=torch.long)
            att = torch.zeros((len(chunk), P), dtype=torch.bool)
            for i, p in enumerate(chunk):
                tok[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
                att[i, P - len(p):] = True
            tok, att = tok.to(dev), att.to(dev)
            pos = (att.long().cumsum(-1) - 1).masked_fill(~att, 0)
            h = decoder(input_ids=tok, attention_mask=att.long(), position_ids=pos, use_cache=False).last_hidden_state
            z = head(h[:, -1]).double()
            if softcap is not None:
                z = torch.tanh(z / softcap) * softcap
            z = z.cpu()
            out.append(z[:, ids])
            mass.append(torch.softmax(z, -1)[:, ids].sum(-1))
    finally:
        model.train(was_training)
    return torch.cat(out), torch.cat(mass)
