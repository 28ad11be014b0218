"""Test helper: a registered method's own policy loss on bare tensors (the composition the
trainer runs: the host objective, the method's corrections, its addends)."""

from policylab import methods
from policylab.methods.loss import policy_loss, tensor_inputs


def method_loss(name, params, logp, adv, mask, **roles):
    """(loss [B, T], metrics) of method `name` with `params` over the given roles."""
    return policy_loss(methods.get(name).with_params(params), tensor_inputs(logp, adv, mask, **roles))
