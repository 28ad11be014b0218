"""Errors raised by policylab. Every one is a ValueError subclass so callers that only
know "bad input" can catch ValueError; the class names say which kind of bad input."""


class PolicylabError(ValueError):
    """Base class of every policylab input error."""


class ConfigError(PolicylabError):
    """A configuration key or value that cannot be used: the message names the key, the
    value and what is accepted."""


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


class CheckpointError(PolicylabError):
    """A checkpoint that cannot be read (damaged, old format, outside the run) or written
    (no space, not writable, non-finite weights). The message names the file and, when
    there is one, the intact checkpoint to fall back to."""


class RunDirError(PolicylabError):
    """A run directory that cannot be used as asked: it holds another run's files, it is
    the current directory, it cannot be written, or it has no room for a checkpoint."""


class RunPathError(RunDirError):
    """A path inside a run directory that policylab will not follow or open: a symbolic
    link (it could point at the user's own files), a special file (FIFO, device, socket:
    opening one can block forever or reach hardware), or a name that resolves outside the
    run. The message names the path and what it is."""


class RunBusyError(RunDirError):
    """Another policylab process holds the run directory's lock (one run per directory)."""


class UntrustedImportError(PolicylabError):
    """A received run directory's config names code (a reward module) outside policylab;
    importing it would run it. Refused unless the user allows it explicitly."""


class MemoryBudgetError(PolicylabError):
    """A step's estimated memory does not fit in the memory available."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a run; the message says at which step, what is intact and
    how to resume. `exit_code`: 130 for Ctrl-C, 143 for SIGTERM (128 + the signal)."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised by the command line's handler, so a run stops the way Ctrl-C
    stops it: with a message saying what is intact)."""


class PolicylabWarning(UserWarning):
    """Input policylab accepts but that is probably not what was meant (a duplicated id in
    a task file, a cut last line in metrics.jsonl ...). The CLI prints it as one line."""
