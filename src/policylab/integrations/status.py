"""`policylab integrations`: which engines are installed, their versions, which policylab
names each has registered, and for every registered method whether the engine hosts it
(hostable / hostable with a requirement the user must set / refused, with the reason).

The plug-ins are checked by loading them the way the engine does (verl: a fresh
interpreter that only runs `import verl`, so only verl's entry-point loading can register
anything; TRL: importing the trainer subclass). The counts are computed from the method
registry and compared with what the engine's registries hold."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys

from policylab.errors import PolicylabError

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
    from policylab.integrations import hosting
    from policylab.integrations.verl import engine as pv
    groups = hosting.by_status(pv.ENGINE)
    out["expected"] = sorted(pv.loss_name(n) for n in pv.losses())
    out["expected_estimators"] = sorted(pv.PREFIX + s for s in pv.estimators())
    out["status"] = {k: {n: (p.refusal() if k == "refused" else "; ".join(p.requires)) for n, p in d.items()}
                     for k, d in groups.items()}
    if len(sys.argv) > 1:
        out["card"] = pv.hosting_card(sys.argv[1])
except Exception as e:
    out.setdefault("error", f"{type(e).__name__}: {e}")
print(json.dumps(out))
"""


def verl_status(python: str | None = None, method: str | None = None) -> dict:
    """The verl probe run by `python` (default: this interpreter)."""
    try:
        run = subprocess.run([python or sys.executable, "-c", _VERL_PROBE, *([method] if method else [])],
                             capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"installed": False, "error": f"could not run {python or sys.executable}: {exc}"}
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    if run.returncode != 0 or not lines:
        return {"installed": False, "error": (run.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def trl_status(method: str | None = None) -> dict:
    try:
        import trl
    except Exception as exc:
        return {"installed": False, "error": f"{type(exc).__name__}: {exc}"}
    out = {"installed": True, "version": trl.__version__}
    try:
        from policylab.integrations import hosting
        from policylab.integrations import trl as pt

        out["methods"] = pt.methods()
        out["status"] = {k: {n: (p.refusal() if k == "refused" else "; ".join(p.requires)) for n, p in d.items()}
                         for k, d in hosting.by_status(pt.ENGINE).items()}
        if method:
            out["card"] = pt.hosting_card(method)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def check_method(name: str) -> None:
    """Refuse a name that is not a registered method, with close matches."""
    from policylab.methods import REGISTRY
    from policylab.methods.registry import refuse_literature

    if name in REGISTRY:
        return
    refuse_literature(name)
    near = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.4)
    hint = f" Did you mean: {', '.join(near)}?" if near else ""
    raise PolicylabError(f"integrations --method: unknown method {name!r}.{hint} `policylab methods` lists them all")


def _groups(lines: list[str], status: dict, total: int) -> None:
    """The three hosting groups of one engine, with counts that add up to `total`."""
    host, req, ref = status["hostable"], status["hostable with a requirement"], status["refused"]
    lines.append(f"  of the {total} registered methods: {len(host) + len(req)} hostable "
                 f"({len(host)} as they are, {len(req)} with a requirement), {len(ref)} refused")
    lines.append(f"  hostable ({len(host)}): {', '.join(sorted(host))}")
    by_need: dict[str, list[str]] = {}
    for n, need in sorted(req.items()):
        by_need.setdefault(need, []).append(n)
    for need, names in by_need.items():
        lines.append(f"  hostable with a requirement ({len(names)}): {', '.join(names)}: requires {need}")
    lines.append(f"  refused ({len(ref)}):")
    for n, why in sorted(ref.items()):
        lines.append(f"    {n}: {why}")


def report(python: str | None = None, method: str | None = None) -> tuple[str, bool]:
    """The text `policylab integrations` prints, and whether every installed engine's
    plug-in loaded with the expected names. An unknown `method` is refused first."""
    from policylab.methods import REGISTRY

    if method is not None:
        check_method(method)
    total = len(REGISTRY)
    lines, ok = [], True
    v = verl_status(python, method)
    where = f" (checked with {python})" if python else ""
    if not v.get("installed"):
        lines.append(f"verl: not installed{where}" + (f" ({v['error']})" if v.get("error") else "")
                     + "; pip install 'policylab[verl]' (or pass --python to the interpreter of verl's venv)")
    else:
        good = (bool(v["losses"]) and v["losses"] == v.get("expected")
                and v["estimators"] == v.get("expected_estimators") and not v.get("error"))
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
        if v.get("status"):
            _groups(lines, v["status"], total)
    t = trl_status(method)
    if not t.get("installed"):
        lines.append("trl: not installed; pip install 'policylab[trl]'")
    else:
        good = bool(t.get("methods")) and not t.get("error")
        ok &= good
        lines.append(f"trl {t['version']}: {'OK' if good else 'PLUG-IN PROBLEM'}")
        if t.get("error"):
            lines.append(f"  policylab.integrations.trl failed to load: {t['error']}")
        lines.append(f"  PolicylabGRPOTrainer methods ({len(t.get('methods', []))}): {', '.join(t.get('methods', []))}")
        if t.get("status"):
            _groups(lines, t["status"], total)
    if method:
        for name, st in (("verl", v), ("TRL", t)):
            lines.append("")
            lines.append(st.get("card") or f"{name}: not installed, no card for `{method}`")
    return "\n".join(lines), ok
