"""Errors raised by policylab. Every one is a ValueError subclass so callers that only
know "bad input" can catch ValueError; the class names say which kind of bad input."""


class PolicylabError(ValueError):
    """Base class of every policylab input error."""


class MissingQuantityError(PolicylabError):
    """A method needs a quantity (a role's log-probs, values, rewards ...) the batch lacks.

    The message names the method, the missing field and how to produce it. policylab
    never zero-fills or substitutes another role for a missing one.
    """

    def __init__(self, method: str, field: str, how: str):
        self.method, self.field, self.how = method, field, how
        super().__init__(f"{method} needs `{field}`, which this batch does not have. {how}")


class ShapeError(PolicylabError):
    """Tensors that must line up do not."""


class NonFiniteError(PolicylabError):
    """NaN or +-inf where a finite value is required (rewards, log-probs, weights)."""


class GroupError(PolicylabError):
    """Group ids or group sizes that a method cannot use (e.g. RLOO with one sample)."""


class BatchReuseError(PolicylabError):
    """A single-use batch was offered for a second update, or from the wrong policy version."""
