"""A frozen critic: a small value head on the hidden states of a frozen base model.

V_ψ(prefix) = σ(head(h(prefix))), where h is the last hidden state of the base model (the
model the critic was trained for, loaded read-only) at the last token of the prefix, and
head a two-layer MLP. It predicts the probability that the reply, continued from this
prefix by the base policy, ends correct. `policylab.pipelines.critic_pretraining.train_frozen_critic`
trains the head on the base model's own labelled rollouts and writes a checkpoint
directory:

    critic.json         format, base model (as the run config names it), a fingerprint of
                        the base weights, head sizes, the fitted length-bias line b(L),
                        the training and calibration statistics
    head.safetensors    the head's weights

`FrozenCritic(path)` rebuilds it from that directory: the base model is loaded again and
its fingerprint must match (a critic is meaningless on other weights). Every parameter has
requires_grad False and the critic belongs to no optimizer (conventions rule 11). As a
method's per-run state its `state_dict()` holds only the path and the fingerprint: a
resumed run rebuilds the critic from its source instead of storing it in the run's
checkpoint, and refuses a checkpoint directory whose critic has changed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from policylab.errors import PolicylabError
from policylab.models.loading import weights_fingerprint

FORMAT = "policylab-frozen-critic/1"


class CriticError(PolicylabError):
    """A critic checkpoint that is missing, malformed or made for other base weights."""


class CriticHead(torch.nn.Module):
    def __init__(self, hidden_size: int, width: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(hidden_size, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Logit of success, [...] for hidden states [..., H]."""
        return self.net(h.float()).squeeze(-1)


@torch.no_grad()
def hidden_states(model: torch.nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L, H] last hidden states of the base model (position ids over real tokens)."""
    am = attention_mask.long()
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    out = model.get_decoder()(input_ids=tokens, attention_mask=am, position_ids=pos, use_cache=False)
    return out.last_hidden_state


def prefix_positions(loss_mask: torch.Tensor, prompt_width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Column of the state before each response token ([T]: prompt_width − 1 + t) and of
    the state after each reply's last counted token ([B]; the prompt's last token for an
    empty reply)."""
    T = loss_mask.shape[1]
    before = torch.arange(T) + prompt_width - 1
    pos = torch.arange(T).expand_as(loss_mask)
    last = torch.where(loss_mask, pos, torch.full_like(pos, -1)).max(-1).values  # -1: empty
    return before, prompt_width + last


class FrozenCritic:
    """The critic rebuilt from its checkpoint directory (see the module docstring)."""

    def __init__(self, path: str | Path, *, base=None):
        from policylab.models.loading import load_policy

        self.path = Path(path)
        meta_file, head_file = self.path / "critic.json", self.path / "head.safetensors"
        if not meta_file.is_file() or not head_file.is_file():
            raise CriticError(f"{self.path} is not a critic checkpoint (critic.json and head.safetensors expected); "
                              "train one with `policylab train-critic CONFIG --out DIR`")
        try:
            self.meta = json.loads(meta_file.read_text())
        except ValueError as exc:
            raise CriticError(f"{meta_file}: not JSON: {exc}") from None
        if self.meta.get("format") != FORMAT:
            raise CriticError(f"{meta_file}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
        self.base = base if base is not None else load_policy(self.meta["base_model"])[0]
        self.base.eval().requires_grad_(False)
        got = weights_fingerprint(self.base)
        if got != self.meta["base_fingerprint"]:
            raise CriticError(f"{self.path}: the critic was trained on other base weights (fingerprint "
                              f"{self.meta['base_fingerprint']}, {self.meta['base_model']} now gives {got})")
        self.head = CriticHead(int(self.meta["hidden_size"]), int(self.meta["head_width"]))
        from safetensors.torch import load_file

        self.head.load_state_dict(load_file(str(head_file)))
        self.head.eval().requires_grad_(False)
        self.length_bias = tuple(float(x) for x in self.meta["length_bias"])

    def parameters(self):
        yield from self.base.parameters()
        yield from self.head.parameters()

    @torch.no_grad()
    def values(self, tokens: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
               prompt_width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(V_ψ(s_t) [B, T]: the state before each response token, 0 where not counted;
        V_ψ(y) [B]: the state after the reply's last counted token). Detached, fp32."""
        h = hidden_states(self.base, tokens, attention_mask)
        before, last = prefix_positions(loss_mask, prompt_width)
        v = torch.sigmoid(self.head(h))  # [B, L]
        per_token = torch.where(loss_mask, v[:, before], torch.zeros((), dtype=v.dtype))
        final = v.gather(1, last.clamp(min=prompt_width - 1).unsqueeze(-1)).squeeze(-1)
        return per_token.float(), final.float()

    def state_dict(self) -> dict:
        return {"path": str(self.path), "fingerprint": self.meta["base_fingerprint"],
                "head_sha": hashlib.blake2b((self.path / "head.safetensors").read_bytes(), digest_size=16).hexdigest()}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        if state.get("fingerprint") != mine["fingerprint"] or state.get("head_sha") != mine["head_sha"]:
            raise CriticError(f"the run was trained with another critic ({state.get('path')}); {self.path} holds a "
                              "different one now: resuming would change the reward")


def save_critic(path: str | Path, head: CriticHead, meta: dict) -> Path:
    """Write critic.json and head.safetensors into `path` (created)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(path / "head.safetensors"))
    (path / "critic.json").write_text(json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")
    return path
