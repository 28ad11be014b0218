"""What code a run configuration makes policylab import, named before anything is
imported, and refused from a received run directory unless the user allows it.

A config can name code outside policylab in three places: the task's verifier
(`task.reward: pkg.mod:function`), its shaping terms (`task.extra_rewards`), and the
method (`method: pkg.mod:OBJECT`, or the name of an installed package's entry point in
the group "policylab.methods"). Importing any of them runs its code, so `check_imports`
lists them first and refuses the ones outside policylab unless `allow` (the CLI's
`--allow-imports`, or a config the user passed on the command line themselves).
"""

from __future__ import annotations

from policylab.errors import ConfigError, UntrustedImportError
from policylab.methods.registry import outside_module
from policylab.tasks.source import MODULE_RE, task_imports


def trusted_module(name: str) -> bool:
    """Modules a run directory may name without the user's say-so: policylab's own."""
    return name == "policylab" or name.startswith("policylab.")


def imported_modules(cfg) -> list[tuple[str, str]]:
    """(module, config entry) for every module outside the built-in registry that `cfg` (a
    RunConfig) makes policylab import: the method's and the task's."""
    out = []
    mod = outside_module(cfg.method)
    if mod is not None:
        out.append((mod, f"method = {cfg.method!r}"))
    return out + task_imports(cfg.task)


def check_imports(cfg, source: str, *, allow: bool, say=None) -> list[str]:
    """Name the modules `cfg` will import before anything is imported (through `say`).

    `source` is the file the config came from. Modules outside policylab are refused
    (UntrustedImportError: importing runs their code) unless `allow` is True, the user's
    explicit permission. Returns the module names."""
    mods = imported_modules(cfg)
    for name, where in mods:
        if not MODULE_RE.fullmatch(name):
            raise ConfigError(f"{source}: {where}: {name!r} is not a module name")
    outside = [(n, w) for n, w in mods if not trusted_module(n)]
    if outside and not allow:
        listed = "; ".join(f"`{n}` ({w})" for n, w in outside)
        raise UntrustedImportError(
            f"{source} names code outside policylab: {listed}; importing it runs that code. Nothing was "
            "imported. Pass --allow-imports if you trust this run directory"
        )
    if mods and say is not None:
        say(f"{source} imports: " + ", ".join(f"{n} ({w})" for n, w in mods))
    return [n for n, _ in mods]
