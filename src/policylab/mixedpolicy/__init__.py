"""Mixed-policy learning: kernels over tokens another policy produced (`kernels`) and the
rows that carry them with their provenance (`rows`)."""

from .kernels import (  # noqa: F401
    ContextError, behavior_denominator, check_context_separation, erils_advantages, erils_length_keep,
    graft_compatibility, graft_should_borrow, grin_mixture_logp, luffy_loss, luffy_shaped_weight, mopd_advantages,
    tokenwise_log_ratio, unit_ratio_denominator,
)
