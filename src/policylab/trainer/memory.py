"""How much memory a training step will need, estimated before it samples, and a refusal
(with the setting to lower) when it will not fit.

The estimate is built from the model config (layers n_l, hidden H, intermediate I, heads,
key/value heads n_kv, head dim D, vocabulary V), the element size b of the weights
(4 for fp32, 8 for fp64), the prompt lengths of the call (P = the widest prompt, since a
batch is left-padded to it), the group size G, max_new_tokens T (S = P + T positions)
and train.micro_batch_size m. It counts the memory a step adds to what is already
resident (the weights are resident, so MemAvailable already excludes them):

    sampling, N prompts x G samples = B rows (the FastEngine decode loop):
      kv       = 2 n_l n_kv D b                          bytes per row and position (keys, values)
      cache    = 2 x B S kv                              the cache, and its copy while the
                                                         prefill fills the G rows of each prompt
      prefill  = N P kv + N P (4H + 3I) b + N P^2         one prompt copy of the cache, one layer's
                                                         activations, the attention masks
      head     = B V (4 x 4 + 8)                          logits, scaled, softmax, log-softmax (fp32)
                                                         and the fp64 cumulative sum of the draw
    training, one micro-batch with gradients:
      act      = n_l (8H + 4 n_kv D + 4I) b              activations kept for the backward, per token;
                 n_l (6H + 4 n_kv D + 3I) b              with train.recompute_elementwise (the RMSNorms'
                                                         normalized inputs and silu(g) recomputed,
                                                         policylab.models.recompute)
      rows     = m S act + 3 m T V 4                     a micro-batch's forward and its logits
      prefix   = U P act + 2 m P kv                      train.shared_prefix (G >= 2): the U distinct
                                                         prompts of a minibatch once, plus the rows'
                                                         copies of their keys/values and gradients;
                                                         then rows uses S = T
      first    = (b + 8) x trainable parameters           before the first update only: gradients and
                                                         AdamW's two fp32 moments (later they are resident);
                                                         the critic's too (ppo, vapo)
    estimate = max(sampling, training)                   sampling's cache is freed before training

The per-token activation term was checked on this machine against the peak resident
memory of a SmolLM2-135M-shaped model (30 layers, H 576, I 1536): measured 1.2-1.4 MB
per trained token, the formula gives 1.38 MB; the sampling terms within 5% at prompts of
1,000-2,000 tokens. It is an estimate: other engines (rollout.engine=hf) and other
architectures use memory differently, and `train.dtype: bf16-backward` is counted as fp32
(it keeps bf16 copies of the linear layers' inputs where fp32 keeps the inputs themselves,
some of which other operations keep anyway), so there the estimate errs high.

Available memory is MemAvailable from /proc/meminfo, or the environment variable
POLICYLAB_MEM_AVAILABLE (bytes, or with a K/M/G suffix, e.g. `512M`) when it is set: tests
use it to fake a small machine. POLICYLAB_MEM_CHECK=off turns the check off. A step is
refused (MemoryBudgetError) when its estimate exceeds 90% of what is available.
"""

from __future__ import annotations

import dataclasses

import os
from dataclasses import dataclass, field

from policylab.errors import MemoryBudgetError

FIT_FRACTION = 0.9  # refuse when the estimate exceeds this share of the available memory

__all__ = ["ModelShape", "StepEstimate", "estimate_step", "available_bytes", "check_sampling", "check_eval",
           "FIT_FRACTION"]


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    bytes_per_element: int = 4

    @classmethod
    def of(cls, model) -> "ModelShape":
        """The shape of a Hugging Face causal LM (its config) and its weights' element size."""
        c = model.config
        heads = int(c.num_attention_heads)
        head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
        p = next(model.parameters())
        return cls(layers=int(c.num_hidden_layers), hidden=int(c.hidden_size),
                   intermediate=int(getattr(c, "intermediate_size", 4 * c.hidden_size)), heads=heads,
                   kv_heads=int(getattr(c, "num_key_value_heads", None) or heads), head_dim=head_dim,
                   vocab=int(c.vocab_size), bytes_per_element=max(4, p.element_size()))

    @property
    def kv_bytes(self) -> int:
        """Keys and values of one row at one position, every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_element

    @property
    def act_bytes(self) -> int:
        """Activations kept for the backward per trained token, every layer."""
        return self.activation_bytes(recompute=False)

    def activation_bytes(self, *, recompute: bool) -> int:
        """`act_bytes`, or with the elementwise parts recomputed (module doc)."""
        h, i, kvd = self.hidden, self.intermediate, self.kv_heads * self.head_dim
        if recompute:
            return self.layers * (6 * h + 4 * kvd + 3 * i) * self.bytes_per_element
        return self.layers * (8 * h + 4 * kvd + 4 * i) * self.bytes_per_element


@dataclass
class StepEstimate:
    sampling: int
    training: int
    parts: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return max(self.sampling, self.training)


@dataclass(frozen=True)
class StepLayout:
    """The layout of one step's work: G samples per prompt of <= max_new_tokens, trained
    in `minibatches` minibatches of micro-batches of `micro_batch_size` rows (each distinct
    prompt computed once with `shared_prefix`); `first_update_params` > 0 before the first
    update (its gradients and AdamW moments are allocated then)."""

    group_size: int
    max_new_tokens: int
    micro_batch_size: int = 8
    minibatches: int = 1
    shared_prefix: bool = False
    first_update_params: int = 0
    recompute: bool = False


def sampling_bytes(shape: ModelShape, layout: StepLayout, *, n_prompts: int, prompt_len: int) -> dict:
    N, P, G, T = n_prompts, prompt_len, layout.group_size, layout.max_new_tokens
    B, S, b = N * G, P + T, shape.bytes_per_element
    return {
        "kv cache": 2 * B * S * shape.kv_bytes,
        "prefill": N * P * shape.kv_bytes + N * P * (4 * shape.hidden + 3 * shape.intermediate) * b + N * P * P,
        "output head": B * shape.vocab * (4 * 4 + 8),
    }


def training_bytes(shape: ModelShape, layout: StepLayout, *, n_prompts: int, prompt_len: int) -> dict:
    N, P, G, T = n_prompts, prompt_len, layout.group_size, layout.max_new_tokens
    rows_per_minibatch = max(1, (N * G) // max(1, layout.minibatches))
    m = min(layout.micro_batch_size, rows_per_minibatch)
    parts = {}
    act = shape.activation_bytes(recompute=layout.recompute)
    if layout.shared_prefix and G >= 2:
        U = min(N, rows_per_minibatch)
        parts["shared prompt prefix"] = U * P * act + 2 * m * P * shape.kv_bytes
        parts["micro-batch"] = m * T * act + 3 * m * T * shape.vocab * 4
    else:
        parts["micro-batch"] = m * (P + T) * act + 3 * m * T * shape.vocab * 4
    if layout.first_update_params:
        parts["gradients + AdamW moments (first update)"] = layout.first_update_params * (shape.bytes_per_element + 8)
    return parts


def estimate_step(shape: ModelShape, layout: StepLayout, *, prompt_lengths, train_prompts: int | None = None
                  ) -> StepEstimate:
    """The estimate of the module docstring for one sampling call over prompts of
    `prompt_lengths` (tokens) and the training of a batch of `train_prompts` such prompts
    (default: as many as sampled)."""
    lengths = list(prompt_lengths)
    P = max(lengths) if lengths else 0
    n_train = train_prompts if train_prompts is not None else len(lengths)
    s = sampling_bytes(shape, layout, n_prompts=len(lengths), prompt_len=P)
    t = training_bytes(shape, layout, n_prompts=n_train, prompt_len=P)
    return StepEstimate(sampling=sum(s.values()), training=sum(t.values()),
                        parts={**{f"sampling: {k}": v for k, v in s.items()}, **{f"training: {k}": v for k, v in t.items()}})


_SUFFIX = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
           "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


def parse_bytes(text: str) -> int:
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    if unit not in _SUFFIX:
        raise ValueError(text)
    return int(float(num) * _SUFFIX[unit])


def available_bytes() -> int | None:
    """POLICYLAB_MEM_AVAILABLE if set, else MemAvailable of /proc/meminfo, else None."""
    env = os.environ.get("POLICYLAB_MEM_AVAILABLE")
    if env:
        try:
            return parse_bytes(env)
        except ValueError:
            raise MemoryBudgetError(f"POLICYLAB_MEM_AVAILABLE={env!r} is not a size (e.g. 4G, 512M, 1073741824)") from None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _enabled() -> bool:
    return os.environ.get("POLICYLAB_MEM_CHECK", "on").strip().lower() not in ("0", "off", "false", "no")


def _refuse(est: StepEstimate, avail: int, what: str, advice: str) -> None:
    biggest = sorted(est.parts.items(), key=lambda kv: -kv[1])[:3]
    detail = ", ".join(f"{k} {_gib(v)}" for k, v in biggest)
    raise MemoryBudgetError(
        f"{what} needs an estimated {_gib(est.total)} of memory ({detail}), but {_gib(avail)} are available "
        f"(the limit is {int(FIT_FRACTION * 100)}%); {advice}. Nothing was sampled (the estimate is explained in "
        "policylab/trainer/memory.py; POLICYLAB_MEM_CHECK=off skips the check)"
    )


def check_sampling(trainer, prompts) -> None:
    """Before the trainer samples `prompts` (token id lists): refuse the step when its
    estimate does not fit in the available memory, naming the setting to lower."""
    if not _enabled() or not prompts:
        return
    avail = available_bytes()
    if avail is None:
        return
    r, t = trainer.cfg.rollout, trainer.cfg.train
    shape = ModelShape.of(trainer.model)
    first = 0 if trainer.optimizer.state else sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    critic, critic_opt = getattr(trainer, "critic", None), getattr(trainer, "critic_opt", None)
    if critic is not None and critic_opt is not None and not critic_opt.state:
        first += sum(p.numel() for p in critic.parameters() if p.requires_grad)
    lengths = [len(p) for p in prompts]
    layout = StepLayout(group_size=r.group_size, max_new_tokens=r.max_new_tokens, micro_batch_size=t.micro_batch_size,
                        minibatches=t.minibatches, shared_prefix=t.shared_prefix, first_update_params=first,
                        recompute=t.recompute_elementwise)
    kw = dict(prompt_lengths=lengths, train_prompts=r.prompts_per_step)
    est = estimate_step(shape, layout, **kw)
    limit = FIT_FRACTION * avail
    if est.total <= limit:
        return
    what = (f"step {trainer.step + 1} ({len(prompts)} prompts of up to {max(lengths)} tokens x {r.group_size} samples, "
            f"<= {r.max_new_tokens} new tokens, micro-batch {t.micro_batch_size})")
    if est.sampling > limit:
        advice = ("lower rollout.prompts_per_step, rollout.group_size or rollout.max_new_tokens, or shorten the "
                  "prompts (sampling alone does not fit)")
    else:
        advice = "lower rollout.prompts_per_step, rollout.group_size or rollout.max_new_tokens, or shorten the prompts"
        options = [(t.shared_prefix, mb) for mb in range(t.micro_batch_size - 1, 0, -1)]
        if t.shared_prefix:
            options += [(False, mb) for mb in range(t.micro_batch_size, 0, -1)]
        for prefix, mb in options:
            other = dataclasses.replace(layout, micro_batch_size=mb, shared_prefix=prefix)
            if estimate_step(shape, other, **kw).total <= limit:
                change = f"train.micro_batch_size={mb}" if prefix == t.shared_prefix else \
                    f"train.shared_prefix=false and train.micro_batch_size={mb}"
                advice = (f"set {change} (the update is the same up to float rounding; "
                          "`policylab resume` accepts these changes too)")
                break
    _refuse(est, avail, what, advice)


def check_eval(trainer) -> None:
    """Before a held-out evaluation: the same sampling estimate for its largest batch."""
    if not _enabled():
        return
    e = trainer.cfg.eval
    if e.n < 1:
        return
    avail = available_bytes()
    if avail is None:
        return
    prompts = [trainer.encode(x.prompt) for x in trainer.task.heldout(e.n)]
    if not prompts:
        return
    shape = ModelShape.of(trainer.model)
    n = min(e.batch_size, len(prompts))
    P = max(len(p) for p in prompts)
    parts = sampling_bytes(shape, StepLayout(group_size=e.samples, max_new_tokens=e.max_new_tokens), n_prompts=n,
                           prompt_len=P)
    est = StepEstimate(sampling=sum(parts.values()), training=0, parts={f"sampling: {k}": v for k, v in parts.items()})
    if est.total > FIT_FRACTION * avail:
        _refuse(est, avail, f"evaluation ({n} prompts of up to {P} tokens x {e.samples} samples per batch)",
                "lower eval.batch_size, eval.samples or eval.max_new_tokens")
