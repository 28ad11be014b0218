"""`policylab integrations`: which engines are installed, their versions, and which
policylab names each has registered, checked by loading the plug-in the way the engine
does (verl: a fresh interpreter that only runs `import verl`, so only verl's entry-point
loading can register anything; TRL: importing the trainer subclass)."""

from __future__ import annotations

import json
import subprocess
import sys

_VERL_PROBE = r"""
import json, sys
try:
    import verl
except Exception as e:
    print(json.dumps({"installed": False, "error": f"{type(e).__name__}: {e}"})); sys.exit(0)
from importlib.metadata import entry_points
from verl.trainer.ppo import core_algos as c
out = {"installed": True, "version": verl.__version__,
       "entry_points": [f"{e.name} = {e.value}" for e in entry_points(group="verl.plugins")],
       "losses": sorted(k for k in c.POLICY_LOSS_REGISTRY if k.startswith("policylab_")),
       "estimators": sorted(k for k in c.ADV_ESTIMATOR_REGISTRY if k.startswith("policylab_"))}
if not out["losses"]:
    # verl logs a failing plug-in at DEBUG level only: load it again to show why
    try:
        import policylab.integrations.verl
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
try:
    from policylab.integrations import hosting, verl as pv
    out["expected"] = sorted(pv.loss_name(n) for n in hosting.hostable(pv.ENGINE))
    out["refused"] = {n: p.refusal() for n, p in hosting.plans(pv.ENGINE).items() if not p.hostable}
except Exception as e:
    out.setdefault("error", f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""


def verl_status(python: str | None = None) -> dict:
    """The verl probe run by `python` (default: this interpreter)."""
    try:
        run = subprocess.run([python or sys.executable, "-c", _VERL_PROBE], capture_output=True, text=True,
                             timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"installed": False, "error": f"could not run {python or sys.executable}: {exc}"}
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    if run.returncode != 0 or not lines:
        return {"installed": False, "error": (run.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def trl_status() -> dict:
    try:
        import trl
    except Exception as exc:
        return {"installed": False, "error": f"{type(exc).__name__}: {exc}"}
    out = {"installed": True, "version": trl.__version__}
    try:
        from policylab.integrations import hosting
        from policylab.integrations import trl as pt

        out["methods"] = pt.methods()
        out["refused"] = {n: p.refusal() for n, p in hosting.plans(pt.ENGINE).items() if not p.hostable}
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def report(python: str | None = None, method: str | None = None) -> tuple[str, bool]:
    """The text `policylab integrations` prints, and whether every installed engine's
    plug-in loaded with the expected names."""
    lines, ok = [], True
    v = verl_status(python)
    where = f" (checked with {python})" if python else ""
    if not v.get("installed"):
        lines.append(f"verl: not installed{where}" + (f" ({v['error']})" if v.get("error") else "")
                     + "; pip install 'policylab[verl]' (or pass --python to the interpreter of verl's venv)")
    else:
        good = bool(v["losses"]) and v["losses"] == v.get("expected") and not v.get("error")
        ok &= good
        lines.append(f"verl {v['version']}{where}: {'OK' if good else 'PLUG-IN PROBLEM'}")
        lines.append(f"  entry points (verl.plugins): {', '.join(v['entry_points']) or 'none'}")
        if v.get("error"):
            lines.append(f"  the policylab plug-in failed to load: {v['error']}")
        lines.append(f"  policy losses registered by `import verl` ({len(v['losses'])}): {', '.join(v['losses'])}")
        lines.append(f"  advantage estimators ({len(v['estimators'])}): {', '.join(v['estimators'])}")
        if v.get("expected") is not None and v["losses"] != v.get("expected"):
            missing = sorted(set(v["expected"]) - set(v["losses"]))
            lines.append(f"  expected but not registered: {', '.join(missing) or 'none'}")
        for name, why in sorted(v.get("refused", {}).items()):
            lines.append(f"  not hostable: {why}")
    t = trl_status()
    if not t.get("installed"):
        lines.append("trl: not installed; pip install 'policylab[trl]'")
    else:
        good = bool(t.get("methods")) and not t.get("error")
        ok &= good
        lines.append(f"trl {t['version']}: {'OK' if good else 'PLUG-IN PROBLEM'}")
        if t.get("error"):
            lines.append(f"  policylab.integrations.trl failed to load: {t['error']}")
        lines.append(f"  PolicylabGRPOTrainer methods ({len(t.get('methods', []))}): {', '.join(t.get('methods', []))}")
        for name, why in sorted(t.get("refused", {}).items()):
            lines.append(f"  not hostable: {why}")
    if method:
        lines.append("")
        if v.get("installed"):
            card = subprocess.run([python or sys.executable, "-c",
                                   "import sys; from policylab.integrations import verl as v; "
                                   f"print(v.hosting_card({method!r}))"], capture_output=True, text=True, timeout=300)
            lines.append(card.stdout.strip() or card.stderr.strip().splitlines()[-1])
    return "\n".join(lines), ok
