"""`policylab integrations` in an environment with TRL (and without verl): per-engine,
per-method truth, counts that add up to the registry, and bad names refused."""

from __future__ import annotations

import re

import pytest
from engines import require

from policylab.cli import main
from policylab.methods import REGISTRY


def test_integrations_lists_trl_methods_and_says_what_is_missing(capsys):
    require("trl")
    from policylab.integrations import hosting
    from policylab.integrations import trl as PT

    rc = main(["integrations"])
    out = capsys.readouterr().out
    assert "trl 1.16.0: OK" in out and "PolicylabGRPOTrainer methods" in out and "cispo" in out
    assert "zcpo: TRL cannot host policylab method `zcpo`" in out
    # the engine-mismatch corrections need the sampler's log-probs: hostable only with vLLM or a rollout_func
    req = re.search(r"hostable with a requirement \((\d+)\): ([a-z_, ]+): requires (TRL passes the sampler.*)",
                    out.split("trl 1.16.0")[1])
    # (with them the round-extension methods whose round stage reads the sampler's log-probs)
    assert req and req.group(2).split(", ") == ["gmc", "icepop", "kpop", "minirl", "mis", "missing_old_logits",
                                             "online_icepop", "tis"]
    assert "use_vllm=True" in req.group(3) and "rollout_func" in req.group(3)
    groups = hosting.by_status(PT.ENGINE)
    counts = [len(groups[k]) for k in ("hostable", "hostable with a requirement", "refused")]
    assert sum(counts) == len(REGISTRY) == 56
    assert counts[0] + counts[1] == len(PT.methods())
    assert (f"of the 56 registered methods: {counts[0] + counts[1]} hostable ({counts[0]} as they are, "
            f"{counts[1]} with a requirement), {counts[2]} refused") in out
    try:
        import verl  # noqa: F401
    except ImportError:
        assert "verl: not installed" in out and "--python" in out
    assert rc == 0


def test_integrations_method_card_for_trl(capsys):
    require("trl")
    assert main(["integrations", "--method", "tis"]) == 0
    out = capsys.readouterr().out
    assert "policylab method `tis` in TRL (hostable with a requirement)" in out
    assert main(["integrations", "--method", "zcpo"]) == 0
    assert "TRL cannot host policylab method `zcpo`: round stage `zcpo_drift`" in capsys.readouterr().out


@pytest.mark.parametrize("name,near", [("nosuch", None), ("grpoo", "grpo"), ("cisp", "cispo")])
def test_an_unknown_method_is_refused_with_exit_2_naming_it(capsys, name, near):
    rc = main(["integrations", "--method", name])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""  # refused before any engine is probed
    line = captured.err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("policylab: error:") and repr(name) in line
    assert "Traceback" not in captured.err
    if near:
        assert f"Did you mean: {near}" in line
