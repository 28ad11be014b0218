"""A pairwise reward model: a causal LM's backbone and a scalar head read at the last
token of prompt + reply, trained on ranked comparisons.

"Training language models to follow instructions with human feedback" (Ouyang et al.,
arXiv 2203.02155), Eq. (1): for the K ranked replies of a prompt, every ordered pair
(y_w ≻ y_l) contributes

    ℓ = −log σ(r_ψ(x, y_w) − r_ψ(x, y_l)),   averaged over the C(K, 2) pairs of the prompt,

and all pairs of one prompt stay in one batch element (`pairwise_loss` takes the K scores
of each prompt together). As in the paper the model starts from the SFT policy's weights
(a causal LM backbone; its output head is not used). Saved as a directory:

    backbone/            the LM, save_pretrained (model + tokenizer)
    head.safetensors     the scalar head (weight [1, hidden], bias [1])
    reward_model.json    format, training summary, held-out pair accuracy
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from policylab.errors import PolicylabError, ShapeError

FORMAT = "policylab-reward-model/1"


def pairwise_loss(scores: torch.Tensor, ranks: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Mean over prompts of the mean over their ordered pairs of −log σ(s_w − s_l).

    scores [P, K] (differentiable), ranks [P, K] the known preference (higher is better;
    equal ranks make no pair). A prompt without any ordered pair is refused. Returns
    (loss, {"pair_accuracy", "pairs"}): accuracy counts s_w > s_l (ties 0.5)."""
    if scores.dim() != 2 or scores.shape != ranks.shape:
        raise ShapeError(f"scores and ranks must both be [P, K], got {tuple(scores.shape)} and {tuple(ranks.shape)}")
    if scores.shape[1] < 2:
        raise ShapeError(f"a prompt needs K >= 2 ranked replies to make a pair, got K = {scores.shape[1]}")
    if not bool(torch.isfinite(scores).all()) or not bool(torch.isfinite(ranks).all()):
        raise PolicylabError("scores and ranks must be finite")
    better = ranks.unsqueeze(2) > ranks.unsqueeze(1)  # [P, K, K]: i ≻ j
    n = better.sum((1, 2))
    if bool((n == 0).any()):
        raise PolicylabError("a prompt has no ordered pair (all its ranks are equal)")
    margin = scores.unsqueeze(2) - scores.unsqueeze(1)  # s_i − s_j
    nll = torch.nn.functional.softplus(-margin)  # −log σ(m), stable
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    per_prompt = torch.where(better, nll, zero).sum((1, 2)) / n
    with torch.no_grad():
        m = margin.detach()
        hits = torch.where(better, (m > 0).to(scores.dtype) + 0.5 * (m == 0).to(scores.dtype), zero).sum()
    return per_prompt.mean(), {"pair_accuracy": float(hits / n.sum()), "pairs": int(n.sum())}


class RewardModel(torch.nn.Module):
    """r_ψ(x, y): `lm`'s final hidden state at the last attended token, through a linear head."""

    def __init__(self, lm: torch.nn.Module, head: torch.nn.Linear | None = None, *, seed: int = 0):
        super().__init__()
        self.lm = lm
        hidden = lm.config.hidden_size
        if head is None:
            head = torch.nn.Linear(hidden, 1)
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                head.weight.normal_(0.0, 1.0 / math.sqrt(hidden), generator=g)
                head.bias.zero_()
        self.head = head.to(next(lm.parameters()).dtype)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B] scores of right- or left-padded sequences (the last True of each mask row)."""
        body = self.lm.model if hasattr(self.lm, "model") else self.lm.base_model
        pos = torch.cumsum(attention_mask.long(), 1) - 1
        out = body(input_ids=tokens, attention_mask=attention_mask.long(), position_ids=pos.clamp(min=0))
        h = out.last_hidden_state
        last = (attention_mask.long() * torch.arange(tokens.shape[1], device=tokens.device)).argmax(1)
        return self.head(h[torch.arange(tokens.shape[0]), last]).squeeze(-1).float()

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, attention_mask: torch.Tensor, micro_batch: int = 16) -> torch.Tensor:
        was = self.training
        self.eval()
        try:
            return torch.cat([self(tokens[i:i + micro_batch], attention_mask[i:i + micro_batch])
                              for i in range(0, tokens.shape[0], micro_batch)])
        finally:
            self.train(was)

    def save(self, path: Path, tokenizer, summary: dict) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.lm.save_pretrained(path / "backbone")
        tokenizer.save_pretrained(path / "backbone")
        save_file({"weight": self.head.weight.detach().float().contiguous(),
                   "bias": self.head.bias.detach().float().contiguous()}, str(path / "head.safetensors"))
        (path / "reward_model.json").write_text(json.dumps({"format": FORMAT, **summary}, indent=2))
        return path


def load_reward_model(path: str | Path, *, dtype=torch.float32):
    """(RewardModel, tokenizer, summary) from a directory `RewardModel.save` wrote."""
    from safetensors.torch import load_file

    from policylab.models.loading import load_policy

    path = Path(path).expanduser()
    meta = path / "reward_model.json"
    if not meta.is_file():
        raise PolicylabError(f"{path} is not a reward model directory (no reward_model.json): the ppo_rlhf pipeline's "
                             "reward-model stage writes one")
    summary = json.loads(meta.read_text())
    if summary.get("format") != FORMAT:
        raise PolicylabError(f"{meta}: format {summary.get('format')!r}, expected {FORMAT!r}")
    lm, tokenizer = load_policy(str(path / "backbone"), dtype=dtype)
    w = load_file(str(path / "head.safetensors"))
    head = torch.nn.Linear(w["weight"].shape[1], 1)
    with torch.no_grad():
        head.weight.copy_(w["weight"])
        head.bias.copy_(w["bias"])
    return RewardModel(lm, head), tokenizer, summary


def encode_pairs(tokenizer, encode_prompt, examples, texts_per_example: list[list[str]]):
    """(tokens [P·K, L], attention [P·K, L]) of prompt + reply + eos, right-padded."""
    rows = []
    for ex, texts in zip(examples, texts_per_example):
        p = encode_prompt(ex.prompt)
        for t in texts:
            rows.append(p + tokenizer(t, add_special_tokens=False)["input_ids"] + [int(tokenizer.eos_token_id)])
    L = max(len(r) for r in rows)
    tokens = torch.full((len(rows), L), int(tokenizer.pad_token_id), dtype=torch.long)
    att = torch.zeros((len(rows), L), dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
        att[i, :len(r)] = True
    return tokens, att


class RewardModelState:
    """The reward model of a PPO run, as per-run state: rebuilt from `spec` by the
    method's model stage, never stored in checkpoints (its state is the spec and a weight
    fingerprint, checked on resume).

    spec PATH        a directory `RewardModel.save` wrote (the pipeline's RM stage)
    spec "untrained" the initial policy's backbone with a seeded random head: scores that
                     mean nothing, for tests of the plumbing only
    """

    def __init__(self, spec: str):
        self.spec = str(spec or "")
        self.model: RewardModel | None = None
        self.fingerprint = ""
        self.summary: dict = {}

    def build(self, policy: torch.nn.Module, tokenizer) -> None:
        import copy

        from policylab.models.loading import weights_fingerprint

        if self.model is not None:
            return
        if not self.spec:
            raise PolicylabError("ppo_rlhf needs a trained reward model: method_params.reward_model = its directory "
                                 "(`policylab pipeline ppo_rlhf CONFIG` trains one)")
        dtype = next(policy.parameters()).dtype
        if self.spec == "untrained":
            base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
            self.model = RewardModel(copy.deepcopy(base))
            self.summary = {"untrained": True}
        else:
            self.model, rm_tok, self.summary = load_reward_model(self.spec, dtype=dtype)
            if len(rm_tok) != len(tokenizer) or rm_tok.get_vocab() != tokenizer.get_vocab():
                raise PolicylabError(f"the reward model {self.spec} has another vocabulary ({len(rm_tok)} tokens) than "
                                     f"the policy ({len(tokenizer)}): it scores the policy's token ids, so they must "
                                     "be the same")
        self.model.to(next(policy.parameters()).device).eval().requires_grad_(False)
        self.fingerprint = weights_fingerprint(self.model)

    def score(self, batch) -> torch.Tensor:
        """[B] r_ψ of each row's prompt + response (no gradient, the model in eval mode)."""
        if self.model is None:
            raise PolicylabError("the reward model is not built (its method's model stage builds it)")
        return self.model.score(batch.tokens, batch.attention_mask)

    def state_dict(self) -> dict:
        return {"spec": self.spec, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        if state.get("spec") != self.spec or (self.model is not None and state.get("fingerprint") != self.fingerprint):
            raise PolicylabError(f"the checkpointed run used the reward model {state.get('spec')!r} with other weights "
                                 f"than {self.spec!r} has now")
