"""`RolloutBatch` and `concat_batches` (the layout and the provenance rules are in the
package docstring, `policylab.batch`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from policylab.batch.provenance import HOW_TO_PRODUCE, LEARNER, SOURCE_KINDS, ProvenanceError, source_kind
from policylab.batch.sampling import SamplingSettings
from policylab.errors import MissingQuantityError, ShapeError
from policylab.kernels.checks import check_finite, check_mask, group_index


_BT_FLOAT = ("logp_behavior", "logp_old", "logp_ref", "logp_current", "values", "token_rewards")


BT_FIELDS = _BT_FLOAT + ("behavior_mask",)  # every [B, T] field (trimmed and padded with the response columns)


_B_FIELDS = ("rewards", "greedy_rewards")


@dataclass(frozen=True)
class RolloutBatch:
    tokens: torch.Tensor  # [B, L] long
    attention_mask: torch.Tensor  # [B, L] bool
    loss_mask: torch.Tensor  # [B, T] bool
    prompt_width: int  # P: response columns start here
    group: torch.Tensor  # [B] long, same-prompt group id
    policy_version: torch.Tensor  # [B] long, weights version that sampled
    batch_id: str
    source: tuple[str, ...] = ()  # per sequence: native / demonstration / gold / guided / ... (() = all native)
    producer: tuple[str, ...] = ()  # per sequence: the producing model's identity (() = "policy" for every row)
    engine: str = "unknown"  # which implementation produced logp_behavior (of the native rows)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    # log-probs by role, [B, T]
    logp_behavior: torch.Tensor | None = None
    behavior_mask: torch.Tensor | None = None  # [B, T] bool: where logp_behavior is known (None: everywhere)
    logp_old: torch.Tensor | None = None
    logp_ref: torch.Tensor | None = None
    logp_current: torch.Tensor | None = None  # the learner at the start of the update round, detached
    values: torch.Tensor | None = None
    # rewards in their forms
    rewards: torch.Tensor | None = None  # [B] shaped scalar reward
    token_rewards: torch.Tensor | None = None  # [B, T]
    reward_vectors: torch.Tensor | None = None  # [B, D]
    reward_intervals: torch.Tensor | None = None  # [B, 2]
    greedy_rewards: torch.Tensor | None = None  # [B]
    outcome: dict[str, torch.Tensor] = field(default_factory=dict)  # raw metrics [B], unshaped
    extras: dict[str, object] = field(default_factory=dict)  # method-specific, documented by the method

    # ----- derived -------------------------------------------------------------------
    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def response_tokens(self) -> torch.Tensor:
        """[B, T] the response columns of `tokens`."""
        return self.tokens[:, self.prompt_width :]

    @property
    def sources(self) -> tuple[str, ...]:
        """Per-row source labels (a batch built without labels is all native)."""
        return tuple(self.source) if self.source else ("native",) * self.size

    @property
    def producers(self) -> tuple[str, ...]:
        """Per-row producer identities ("policy" when none was recorded: all rows native)."""
        return tuple(self.producer) if self.producer else (LEARNER,) * self.size

    def source_rows(self, *kinds: str) -> torch.Tensor:
        """[B] bool: rows whose source kind is one of `kinds` (e.g. "native", "peer")."""
        for k in kinds:
            if k not in SOURCE_KINDS:
                raise ProvenanceError(f"unknown source kind {k!r}; kinds are {', '.join(SOURCE_KINDS)}")
        return torch.tensor([source_kind(s) in kinds for s in self.sources], dtype=torch.bool,
                            device=self.loss_mask.device)

    @property
    def response_lengths(self) -> torch.Tensor:
        """[B] number of valid response tokens (what counts in the loss)."""
        return self.loss_mask.sum(-1)

    # ----- checks --------------------------------------------------------------------
    def require(self, method: str, *fields: str) -> None:
        """Raise MissingQuantityError naming `method` if any of `fields` is absent."""
        for name in fields:
            value = getattr(self, name, None) if name != "outcome" else self.outcome
            if name.startswith("outcome."):
                value = self.outcome.get(name.split(".", 1)[1])
            if value is None:
                how = HOW_TO_PRODUCE.get(name, "Produce it before calling this method.")
                raise MissingQuantityError(method, name, how)
            if name == "logp_behavior" and self.behavior_mask is not None:
                lacking = (self.loss_mask & ~self.behavior_mask).any(-1)
                if bool(lacking.any()):
                    kinds = sorted({self.sources[i] for i in lacking.nonzero().squeeze(-1).tolist()})
                    raise MissingQuantityError(
                        method, name, f"Rows of source {', '.join(kinds)} carry no behavior log-probs at some "
                        "counted positions (`behavior_mask` False): their producer's distribution over these "
                        "tokens is unknown (e.g. another tokenization). Use a method that does not read them for "
                        "such rows, or drop the rows.")

    def validate(self) -> "RolloutBatch":
        """Check shapes, dtypes, masks, group ids and finiteness; return self."""
        B, L = self.tokens.shape if self.tokens.dim() == 2 else (None, None)
        if B is None:
            raise ShapeError(f"`tokens` must be [B, L], got {tuple(self.tokens.shape)}")
        if self.tokens.dtype != torch.long:
            raise ShapeError(f"`tokens` must be long, got {self.tokens.dtype}")
        check_mask(self.attention_mask, "attention_mask")
        check_mask(self.loss_mask, "loss_mask")
        if self.attention_mask.shape != self.tokens.shape:
            raise ShapeError(
                f"`attention_mask` {tuple(self.attention_mask.shape)} != `tokens` {tuple(self.tokens.shape)}"
            )
        if not 0 <= self.prompt_width < L:
            raise ShapeError(f"`prompt_width` {self.prompt_width} must be in [0, {L})")
        T = L - self.prompt_width
        if self.loss_mask.shape != (B, T):
            raise ShapeError(f"`loss_mask` must be [B, T] = {(B, T)}, got {tuple(self.loss_mask.shape)}")
        if bool((self.loss_mask & ~self.attention_mask[:, self.prompt_width :]).any()):
            raise ShapeError("`loss_mask` is True at a padding position (attention_mask False)")
        group_index(self.group, B)
        if self.policy_version.shape != (B,):
            raise ShapeError(f"`policy_version` must be [B] = ({B},), got {tuple(self.policy_version.shape)}")
        self._validate_provenance(B, T)
        for name in _BT_FLOAT:
            t = getattr(self, name)
            if t is None:
                continue
            if t.shape != (B, T):
                raise ShapeError(f"`{name}` must be [B, T] = {(B, T)}, got {tuple(t.shape)}")
            if not t.is_floating_point():
                raise ShapeError(f"`{name}` must be floating point, got {t.dtype}")
            check_finite(t, name, self.loss_mask)
            if name.startswith("logp") and bool((t[self.loss_mask] > 1e-6).any()):
                raise ShapeError(f"`{name}` has log-probabilities > 0 at counted positions")
        for name in _B_FIELDS:
            t = getattr(self, name)
            if t is not None:
                if t.shape != (B,):
                    raise ShapeError(f"`{name}` must be [B] = ({B},), got {tuple(t.shape)}")
                # a self-labelled reward may be NaN where its label does not exist, and only
                # where `outcome["eligible"]` says so (a filter must remove those rows)
                eligible = self.outcome.get("eligible") if name == "rewards" else None
                check_finite(t, name, eligible.bool() if eligible is not None else None)
        if self.reward_vectors is not None and (
            self.reward_vectors.dim() != 2 or self.reward_vectors.shape[0] != B
        ):
            raise ShapeError(f"`reward_vectors` must be [B, D], got {tuple(self.reward_vectors.shape)}")
        if self.reward_intervals is not None:
            if self.reward_intervals.shape != (B, 2):
                raise ShapeError(f"`reward_intervals` must be [B, 2], got {tuple(self.reward_intervals.shape)}")
            if bool((self.reward_intervals[:, 0] > self.reward_intervals[:, 1]).any()):
                raise ShapeError("`reward_intervals` has a row with low > high")
        for key, t in self.outcome.items():
            if t.shape != (B,):
                raise ShapeError(f"`outcome['{key}']` must be [B] = ({B},), got {tuple(t.shape)}")
        return self

    def _validate_provenance(self, B: int, T: int) -> None:
        if self.source and len(self.source) != B:
            raise ShapeError(f"`source` has {len(self.source)} entries for {B} sequences")
        if self.producer and len(self.producer) != B:
            raise ShapeError(f"`producer` has {len(self.producer)} entries for {B} sequences")
        kinds = [source_kind(s) for s in self.sources]
        if not self.producer and any(k != "native" for k in kinds):
            raise ProvenanceError("a batch with non-native rows must record each row's `producer`")
        for i, (label, kind, who) in enumerate(zip(self.sources, kinds, self.producers)):
            if not isinstance(who, str) or not who:
                raise ProvenanceError(f"row {i}: `producer` must be a non-empty string, got {who!r}")
            if kind == "native" and who != LEARNER:
                raise ProvenanceError(f"row {i} is native but its producer is {who!r}: a native row is sampled by "
                                      f"the learner ({LEARNER!r}) from the deployment context")
            if kind == "peer" and who != label.partition(":")[2]:
                raise ProvenanceError(f"row {i}: source {label!r} but producer {who!r} (they name the same model)")
        bm = self.behavior_mask
        if bm is not None:
            check_mask(bm, "behavior_mask")
            if bm.shape != (B, T):
                raise ShapeError(f"`behavior_mask` must be [B, T] = {(B, T)}, got {tuple(bm.shape)}")
            if self.logp_behavior is None:
                raise ShapeError("`behavior_mask` without `logp_behavior`")
            native = torch.tensor([k == "native" for k in kinds], dtype=torch.bool, device=bm.device)
            if bool((self.loss_mask & ~bm & native.unsqueeze(-1)).any()):
                raise ProvenanceError("a native row lacks its behavior log-probs (`behavior_mask` False at a "
                                      "counted position): the rollout engine records them as it samples")

    # ----- transforms ----------------------------------------------------------------
    def replace(self, **changes) -> "RolloutBatch":
        """A copy with some fields replaced (the batch is frozen).

        Provenance is never rewritten: a row's `source` may change only from native to
        another kind (a sequence found not to come from the deployment context, e.g. it
        was sampled under a hinted prompt), its `producer` only together with that; a
        non-native row can never become native (`ProvenanceError`)."""
        if "source" in changes or "producer" in changes:
            _check_relabel(self, changes)
        return dataclasses.replace(self, **changes)

    def select(self, index: torch.Tensor) -> "RolloutBatch":
        """The sub-batch of sequences `index` (long indices or a bool [B] mask).

        Every per-sequence field is indexed; `batch_id` gets a suffix only if the caller
        asks (sub-batches of one batch share its id: they are the same sampled data)."""
        if index.dtype == torch.bool:
            index = index.nonzero().squeeze(-1)
        changes: dict = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == self.size:
                changes[f.name] = v[index]
        changes["source"] = tuple(self.source[i] for i in index.tolist()) if self.source else ()
        changes["producer"] = tuple(self.producer[i] for i in index.tolist()) if self.producer else ()
        changes["outcome"] = {k: v[index] for k, v in self.outcome.items()}
        changes["extras"] = {
            k: (v[index] if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == self.size else v)
            for k, v in self.extras.items()
        }
        return dataclasses.replace(self, **changes)


def _check_relabel(old: RolloutBatch, changes: dict) -> None:
    """Refuse a `replace` that rewrites the provenance of rows already collected."""
    new_src = tuple(changes.get("source", old.source))
    new_prod = tuple(changes.get("producer", old.producer))
    B = int(changes["tokens"].shape[0]) if "tokens" in changes else old.size
    if B != old.size:
        raise ProvenanceError("replace cannot change the number of rows together with their provenance; build a "
                              "new batch (or use select / concat_batches)")
    before_s, before_p = old.sources, old.producers
    after_s = new_src if new_src else ("native",) * B
    after_p = new_prod if new_prod else (LEARNER,) * B
    if len(after_s) != B or len(after_p) != B:
        raise ShapeError(f"`source` / `producer` must have {B} entries")
    for i in range(B):
        if after_s[i] == before_s[i] and after_p[i] == before_p[i]:
            continue
        if source_kind(before_s[i]) != "native":
            what = "native" if source_kind(after_s[i]) == "native" else repr(after_s[i])
            raise ProvenanceError(
                f"row {i} is {before_s[i]!r} (produced by {before_p[i]!r}) and cannot be relabelled {what}: the "
                "provenance of collected sequences is never rewritten")
        if source_kind(after_s[i]) == "native":
            raise ProvenanceError(f"row {i}: a native row keeps its producer {LEARNER!r}")


def concat_batches(batches: list[RolloutBatch], batch_id: str) -> RolloutBatch:
    """Stack batches sampled in separate engine calls (e.g. dynamic-sampling refills), or
    parts of other provenance (demonstrations, peer groups) next to native rows.

    Prompts are re-aligned by left-padding to the widest prompt, responses right-padded to
    the longest; padded positions have attention_mask = loss_mask = False (they never count).
    Batches must share sampling settings (the learner scores every row under them) and
    carry the same optional fields. Batches holding native rows must come from one engine;
    the result records that engine (parts without native rows name their producers per row).
    Every row keeps its source and producer."""
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    if len(batches) == 1:
        return batches[0].replace(batch_id=batch_id)
    first = batches[0]
    for b in batches[1:]:
        if b.sampling != first.sampling:
            raise ValueError("cannot concatenate batches sampled with different settings")
    engines = {b.engine for b in batches if "native" in {source_kind(s) for s in b.sources}}
    if len(engines) > 1:
        raise ValueError("cannot concatenate native rows sampled by different engines")
    engine = engines.pop() if engines else first.engine
    P = max(b.prompt_width for b in batches)
    T = max(b.loss_mask.shape[1] for b in batches)

    def pad_seq(t: torch.Tensor, b: RolloutBatch, value) -> torch.Tensor:  # [B, L] full sequences
        left = P - b.prompt_width
        right = T - b.loss_mask.shape[1]
        return torch.nn.functional.pad(t, (left, right), value=value)

    def pad_resp(t: torch.Tensor, value) -> torch.Tensor:  # [B, T] response-aligned
        return torch.nn.functional.pad(t, (0, T - t.shape[1]), value=value)

    out: dict = {
        "tokens": torch.cat([pad_seq(b.tokens, b, 0) for b in batches]),
        "attention_mask": torch.cat([pad_seq(b.attention_mask, b, False) for b in batches]),
        "loss_mask": torch.cat([pad_resp(b.loss_mask, False) for b in batches]),
        "prompt_width": P,
        "batch_id": batch_id,
        "source": sum((b.sources for b in batches), ()) if any(b.source for b in batches) else (),
        "producer": sum((b.producers for b in batches), ()) if any(b.producer for b in batches) else (),
        "engine": engine,
    }
    for name in ("group", "policy_version") + _B_FIELDS:
        vals = [getattr(b, name) for b in batches]
        _same_presence(name, vals)
        if vals[0] is not None:
            out[name] = torch.cat(vals)
    for name in _BT_FLOAT:
        vals = [getattr(b, name) for b in batches]
        _same_presence(name, vals)
        if vals[0] is not None:
            out[name] = torch.cat([pad_resp(v, 0.0) for v in vals])
    if any(b.behavior_mask is not None for b in batches):
        out["behavior_mask"] = torch.cat([pad_resp(b.behavior_mask if b.behavior_mask is not None else b.loss_mask,
                                                   False) for b in batches])
    for name in ("reward_vectors", "reward_intervals"):
        vals = [getattr(b, name) for b in batches]
        _same_presence(name, vals)
        if vals[0] is not None:
            out[name] = torch.cat(vals)
    keys = set(first.outcome)
    if any(set(b.outcome) != keys for b in batches):
        raise ValueError("cannot concatenate batches with different outcome metrics")
    out["outcome"] = {k: torch.cat([b.outcome[k] for b in batches]) for k in keys}
    extras = {}
    for k, v in first.extras.items():
        if not (isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == first.size):
            continue
        parts = [b.extras[k] for b in batches]
        if v.dim() >= 2 and all(p.shape[1] == b.loss_mask.shape[1] for p, b in zip(parts, batches)):
            # response-aligned [B, T, ...]: right-pad along T like the other [B, T] fields
            parts = [torch.nn.functional.pad(p.movedim(1, -1), (0, T - p.shape[1])).movedim(-1, 1) for p in parts]
        extras[k] = torch.cat(parts)
    out["extras"] = extras
    return dataclasses.replace(first, **out)


def _same_presence(name: str, vals: list) -> None:
    if len({v is None for v in vals}) > 1:
        raise ValueError(f"cannot concatenate batches where only some carry `{name}`")
