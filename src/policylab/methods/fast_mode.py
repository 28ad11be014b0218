"""The fast sampling mode, one setting: `rollout.engine: fast-bf16`.

What the setting does, and only this:

* **Sampling**: FastEngine on a bf16 copy of the weights (rebuilt from the fp32 weights
  at every call), on hosts whose CPU multiplies bf16 natively (`engines.cpu.fast_dtype`:
  AVX-512 BF16 or AMX; refused elsewhere, where bf16 is emulated through fp32 and
  gains nothing). The engine records its own log-probs as the behavior μ
  (`logp_behavior`, engine "fast-bf16"), so the batch says truthfully who sampled it.
* **Correction by default**: a method without a correction stage of its own is paired
  with truncated importance sampling on the engine ratio k = π_old/μ (`pair_correction`): each token's host loss is
  multiplied by sg(min(k, C)), C = `tis_cap` (2.0, configurable as a method parameter),
  π_old being the trainer's log-prob at the sampling weights. In a single on-policy
  update (one epoch, one minibatch, no staleness) that is the training forward itself,
  detached: k = exp(sg(log π_θ) − log μ) is formed inside the optimizer step
  (`backends.update.step_inputs`) and no separate π_old pass runs; with several updates
  per batch, a stale batch or a stage that reads π_old before the update, the trainer's
  no-grad old pass computes it (`Trainer.old_pass_reasons`; the run header's "old logp"
  line says which). A method with a correction stage of its own (tis, icepop, mis, gmc,
  sis, ...) keeps it; a method whose tokens do not all come from the on-policy rollout
  source is refused.
* **Training**: fp32 master weights. `train.dtype: auto` (the default) resolves under this
  engine, on a CPU with native bf16 (`engines.cpu.bf16_training_native`), to
  - bf16 (the decoder body in bf16 autocast; the output head, log-softmax and every ratio
    in fp32, conventions rule 13) if the measured log-prob error of that forward allowed
    it (`BF16_TRAINING_ALLOWED`). It does not (`BF16_TRAINING_WHY`): its largest error
    exceeds the sampler's own;
  - else bf16-backward (`policylab.models.bf16_backward`: every forward value, so every
    log-prob, ratio, clip decision and loss, exactly the fp32 forward's; only the linear
    layers' backward products from bf16-rounded operands) if its measured gradient error
    is small against the gradient's sampling noise (`BF16_BACKWARD_ALLOWED`). It is
    (`BF16_BACKWARD_WHY`), so this is what auto picks today;
  - fp32 on any other host (emulated bf16 gains nothing) and for every other engine.
  Both rules, fixed before their measurements, and the numbers: benchmarks/fast_mode_error.py
  and benchmarks/results/fast_mode_error.md. An explicit `train.dtype` (fp32, bf16,
  bf16-backward, fp64) is kept as given.

Why TIS and not IcePop. At the mismatch this engine produces on the embedded model
(benchmarks/results/fast_mode_error.md: mean |Δlog p| 0.036, max 0.39 over 2,866 tokens;
benchmarks/results/fast_mode_quickstart.md: engine ratios within [0.48, 1.58] over a
10-step quickstart run) both are nearly inert: TIS truncated 0.02% of the tokens at C = 2,
and IcePop's band [0.5, 5] would have zeroed a comparable sliver (ratios just below 0.5).
TIS keeps every token's gradient (a zeroed token is signal thrown away, and the normalizer
still counts it) and reweights each one toward the trainer's distribution, which is the
fix its authors propose for exactly this pairing (a fast inference engine sampling for an
exact trainer: "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
Yao, Liu et al.). IcePop's hard band is built for the rare, large engine ratios of MoE
routing mismatches (Ring-1T, arXiv 2510.18855), which a dense 135M model in bf16 does not
produce. A mismatch that grew large would show in `correction/tis/frac_capped` (logged
every step).
"""

from __future__ import annotations

import dataclasses

from policylab.errors import ConfigError
from policylab.methods.spec import Method, Param, positive

__all__ = ["BF16_BACKWARD_ALLOWED", "BF16_BACKWARD_WHY", "BF16_TRAINING_ALLOWED", "BF16_TRAINING_WHY", "FAST_ENGINES",
           "CORRECTION_WHY", "engine_corrections", "pair_correction", "train_dtype"]

FAST_ENGINES = ("fast-bf16",)

CORRECTION_WHY = ("fast-bf16 samples with another engine than the trainer; TIS keeps every token and reweights "
                  "it by the truncated engine ratio (at this engine's measured mismatch, mean |Δlog p| 0.036, ratios "
                  "in [0.48, 1.58], IcePop's band would only discard tokens)")

# the measured verdict of benchmarks/fast_mode_error.py (its rule, fixed before the measurement:
# the trainer's bf16 forward no further from fp32 than the fast-bf16 sampler itself, in mean and
# max |Δlog p|, and < 1% of tokens outside the clip band). Measured: the mean passes, the max does
# not, so `train.dtype: auto` does not pick bf16 autocast under the fast mode. Measured again
# after the decode step's attention changed (fast_mode_error_decode_attention.md, the same seeds,
# 3,087 tokens): the sampler's max moved to 0.3678 and the bf16 forward's (0.3352) passed it. A
# verdict that one token's maximum turns over between two batch sets of the same seeds does not
# show bf16 autocast to be as close as the sampler, while bf16-backward (an exact forward) is what
# the fast mode's speed and equal-steps learning were measured with; so auto stays with it.
BF16_TRAINING_ALLOWED = False
BF16_TRAINING_WHY = ("on the embedded model (3,056 tokens, an AVX-512 BF16 host) the trainer's bf16 forward (head and "
                     "log-softmax in fp32) is off the fp32 forward by mean |Δlog p| 0.0171, max 0.3352, 0.13% of "
                     "tokens outside the clip band; the fast-bf16 sampler itself: mean 0.0349, max 0.3037. The max "
                     "exceeds the sampler's, so the fast mode does not train in bf16 autocast unless train.dtype: bf16 "
                     "is set")

# the measured verdict of the same script's gradient rule (fixed before the measurement: the
# forward's log-probs identical to fp32's, and on every batch the step gradient's relative
# error against fp32's at most a tenth of the gradient's sampling noise). Measured: both hold.
BF16_BACKWARD_ALLOWED = True
BF16_BACKWARD_WHY = ("on the embedded model (3 batches of the fast-bf16 engine, 4 prompts x 8 samples, an AVX-512 "
                     "BF16 host) the bf16-backward forward equals the fp32 forward on all 3,056 tokens, and its step "
                     "gradient is off fp32's by 0.81-0.90% (cosine >= 0.99996), against a sampling noise of "
                     "129-144% between two batches of the same prompts (error / noise 0.006); bf16 autocast's "
                     "gradient is off by 3.8-4.3%")


def train_dtype(engine: str, flags: frozenset[str] | None = None) -> str:
    """`train.dtype: auto` resolved for `rollout.engine = engine`. Under the fast mode on a
    CPU with native bf16 (`flags`: the CPU's, read from /proc/cpuinfo when None): "bf16"
    while `BF16_TRAINING_ALLOWED`, else "bf16-backward" while `BF16_BACKWARD_ALLOWED`;
    "fp32" otherwise (every other engine, and a CPU that would emulate bf16)."""
    from policylab.engines.cpu import bf16_training_native

    if engine in FAST_ENGINES and bf16_training_native(flags):
        if BF16_TRAINING_ALLOWED:
            return "bf16"
        if BF16_BACKWARD_ALLOWED:
            return "bf16-backward"
    return "fp32"


_TIS_CAP = Param("tis_cap", float, 2.0, "fast mode: truncation C of the engine ratio π_old/μ (upper only)",
                 check=positive)


def engine_corrections(method: Method) -> list[str]:
    """Names of the method's own correction stages (engine ratio, staleness, off-policy
    tokens: every one of them weighs tokens by how the behavior relates to the learner),
    which the fast mode keeps instead of adding TIS on top of them."""
    return [s.name for s in method.corrections]


def _header(p) -> tuple[str, str]:
    return ("mismatch", f"TIS x sg(min(π_old/μ, {p.tis_cap:g})) on every token (fast mode, default): {CORRECTION_WHY}")


def _own_header(names: list[str]):
    def line(p) -> tuple[str, str]:
        return ("mismatch", f"the method's own engine-ratio correction ({', '.join(names)}); fast-bf16 samples with "
                            "another engine than the trainer")
    return line


def pair_correction(method: Method, engine: str) -> Method:
    """The method to train with under `rollout.engine = engine`: unchanged for every
    engine but the fast mode's; under "fast-bf16" the method with TIS on the engine ratio
    added as its last correction stage (see the module doc), its card and start-up summary
    saying so. Refused for a method whose samples do not come from the on-policy engine
    source (its tokens are not the fast engine's alone)."""
    if engine not in FAST_ENGINES:
        return method
    from policylab.methods.stages import losses, sources

    if method.source not in (sources.ON_POLICY, sources.ON_POLICY_TOPK):
        raise ConfigError(
            f"rollout.engine={engine} pairs the method with an engine-mismatch correction on the rollout engine's "
            f"samples, but {method.name}'s samples come from its own source ({method.source.name}), not only from "
            "the rollout engine: use rollout.engine=fast (exact fp32) for this method")
    own = engine_corrections(method)
    if own:
        card = dataclasses.replace(method.card, summary=method.card.summary +
                                   f" [fast mode: the method's own correction {', '.join(own)} on the fast-bf16 engine]")
        return dataclasses.replace(method, card=card, header=tuple(method.header) + (_own_header(own),))
    if any(q.name == "tis_cap" for q in method.params):
        raise ConfigError(f"rollout.engine={engine}: method {method.name} already declares a `tis_cap` parameter for "
                          "another purpose; the fast mode cannot add its own")
    card = dataclasses.replace(
        method.card, samples="behavior μ = fast-bf16 engine (bf16 weight copy) at the sampling weights; π_old = the "
                             "trainer at the same weights (its training forward in a single on-policy update, else "
                             "a recompute)",
        summary=method.card.summary + "; fast mode: x sg(min(π_old/μ, C)) (TIS on the engine ratio)")
    return dataclasses.replace(method, card=card, params=tuple(method.params) + (_TIS_CAP,),
                               corrections=tuple(method.corrections) + (losses.TIS,),
                               header=tuple(method.header) + (_header,))
