"""Metric cards: a registry of their own, listed by `policylab methods` and the README, each
with four bank questions whose worked examples run live."""

from __future__ import annotations

import pytest

from policylab import methods
from policylab.errors import PolicylabError
from policylab.learn.bank import CATEGORIES
from policylab.eval.cards import METRICS, MetricCard, get_metric, metric_names, register_metric
from policylab.learn.bank import metric_bank
from policylab.eval.cards import metric_card_text, metric_table_text


def test_metrics_are_cards_not_training_methods():
    assert metric_names() == ["calib_rl", "sharpening_tax"]
    for name in metric_names():
        assert get_metric(name).family == "metric"
        assert name not in methods.names()
        with pytest.raises(methods.UnknownMethodError):
            methods.get(name)
    with pytest.raises(PolicylabError, match="unknown metric 'calib'.*Did you mean: calib_rl"):
        get_metric("calib")
    with pytest.raises(ValueError, match="already registered"):
        register_metric(METRICS["calib_rl"])


def test_policylab_methods_lists_metrics_with_their_family_and_prints_a_card(capsys):
    from policylab.cli import main

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "ttpo" in out and "tasco" in out
    table = out.split("metrics (evaluation only")[1]
    for name in metric_names():
        assert any(line.split()[:2] == [name, "metric"] for line in table.splitlines() if line.strip())
    assert main(["methods", "calib_rl"]) == 0
    card = capsys.readouterr().out
    assert "decision      the first reply token" in card and "arXiv 2601.13284" in card
    assert "policylab/eval/calibration.py:" in card  # the card leads to the kernels in one hop


def test_every_card_locates_its_kernels():
    for name in metric_names():
        text = metric_card_text(get_metric(name))
        kernels = text.split("  kernels\n")[1].splitlines()
        assert kernels and all(":" in k and "?" not in k for k in kernels)
    assert "sharpening_tax" in metric_table_text()


def test_metric_bank_has_four_questions_in_both_languages_with_live_examples():
    bank = metric_bank()
    assert set(bank) == set(metric_names())
    for name, qs in bank.items():
        assert [q.category for q in qs] == list(CATEGORIES)
        for q in qs:
            assert q.id == f"{name}-{q.category}"
            assert set(q.question) == {"en", "zh"} and set(q.example.text) == {"en", "zh"}
            assert "{" not in q.example.text["en"]  # every placeholder was filled
    values = bank["sharpening_tax"][1].example.values
    assert values["unbiased"] == 0.5  # the spec's hand case n = 4, c = 1, K = 2
    assert bank["calib_rl"][0].example.values["ece"] == 0.15


def test_a_dataclass_card_needs_its_fields():
    with pytest.raises(TypeError):
        MetricCard(name="x")
