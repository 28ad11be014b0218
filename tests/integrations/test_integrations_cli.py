"""`policylab integrations` in an environment with TRL (and without verl)."""

from __future__ import annotations

from engines import require

from policylab.cli import main


def test_integrations_lists_trl_methods_and_says_what_is_missing(capsys):
    require("trl")
    rc = main(["integrations"])
    out = capsys.readouterr().out
    assert "trl 1.16.0: OK" in out and "PolicylabGRPOTrainer methods" in out and "cispo" in out
    assert "not hostable: TRL cannot host policylab method `gmc`" in out
    try:
        import verl  # noqa: F401
    except ImportError:
        assert "verl: not installed" in out and "--python" in out
    assert rc == 0
