"""Fixture banks for the learning layer: a small valid bank (grpo, rloo and one cross-method
question) written into a temporary directory, with its own example functions that call the
real kernels. Tests mutate copies of it to provoke each build error."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from policylab.kernels import advantages


def fx_group_advantages(rewards, std="unbiased"):
    r = torch.tensor(rewards, dtype=torch.float64)
    a = advantages.grpo(r, torch.zeros(len(rewards), dtype=torch.long), std=std)
    return {"rewards": [float(x) for x in rewards], "advantages": a.tolist(), "best": float(a.max()),
            "any_positive": bool((a > 0).any())}


def fx_leave_one_out(rewards):
    r = torch.tensor(rewards, dtype=torch.float64)
    a = advantages.rloo(r, torch.zeros(len(rewards), dtype=torch.long))
    return {"rewards": [float(x) for x in rewards], "advantages": a.tolist(), "k": len(rewards)}


def fx_both(rewards):
    g = fx_group_advantages(rewards)
    return {"grpo": g["advantages"], "rloo": fx_leave_one_out(rewards)["advantages"]}


def fx_broken(rewards):
    raise ValueError("deliberately broken example")


EXAMPLES = {"fx_group_advantages": fx_group_advantages, "fx_leave_one_out": fx_leave_one_out,
            "fx_both": fx_both, "fx_broken": fx_broken}


def _q(method, category, fn, args, compare_with=None, placeholder="advantages"):
    return {
        "id": f"{method}-{category}",
        "category": category,
        "compare_with": compare_with,
        "en": {"question": f"What does {method} do ({category})?",
               "answer": f"It computes advantages such as {{{placeholder}}} from a set {{0,1}}."},
        "zh": {"question": f"{method} 做什么（{category}）？",
               "answer": f"它计算优势，例如 {{{placeholder}}}。"},
        "example": {"function": fn, "args": args,
                    "en": f"Rewards {{rewards}} give advantages {{{placeholder}}}.",
                    "zh": f"奖励 {{rewards}} 得到优势 {{{placeholder}}}。"},
    }


def boundary(name: str) -> dict:
    """A valid boundary block (what the example shows, what it does not, what is needed)."""
    return {"en": {"shows": f"the {name} kernel on a hand-made group", "not_shown": "any training run",
                   "needs": "a trained model and held-out evaluation"},
            "zh": {"shows": f"{name} 内核在手工构造的一组数据上的输出", "not_shown": "任何训练过程",
                   "needs": "训练好的模型和留出集评测"}}


def bank_data() -> dict[str, dict]:
    """{method: YAML document} of the valid fixture bank."""
    g = {"rewards": [1, 0, 0, 0], "std": "population"}
    r = {"rewards": [1.0, 0.0, 0.5]}
    grpo = [_q("grpo", "basics", "fx_group_advantages", g), _q("grpo", "mechanism", "fx_group_advantages", g),
            _q("grpo", "comparison", "fx_group_advantages", g, compare_with="rloo"),
            _q("grpo", "implementation", "fx_group_advantages", g)]
    grpo[1]["example"]["en"] += " Largest: {best}; any positive: {any_positive}."
    grpo[1]["example"]["zh"] += " 最大值：{best}；是否有正值：{any_positive}。"
    rloo = [_q("rloo", c, "fx_leave_one_out", r, compare_with="grpo" if c == "comparison" else None)
            for c in ("basics", "mechanism", "comparison", "implementation")]
    return {"grpo": {"method": "grpo", "boundary": boundary("grpo"), "questions": grpo},
            "rloo": {"method": "rloo", "boundary": boundary("rloo"), "questions": rloo}}


def topics_data() -> dict:
    q = {"id": "x-grpo-rloo", "category": "comparison", "methods": ["grpo", "rloo"],
         "en": {"question": "GRPO or RLOO on the same rewards?", "answer": "Compare {grpo} with {rloo}."},
         "zh": {"question": "同样的奖励下 GRPO 与 RLOO 有何不同？", "answer": "比较 {grpo} 与 {rloo}。"},
         "example": {"function": "fx_both", "args": {"rewards": [1, 0, 0]},
                     "en": "GRPO {grpo} vs RLOO {rloo}.", "zh": "GRPO {grpo} 对比 RLOO {rloo}。"},
         "boundary": boundary("grpo and rloo")}
    step = {"topic": {"en": "Baselines without a critic", "zh": "无需价值网络的基线"}, "methods": ["grpo", "rloo"],
            "why": {"en": "Both replace the critic by other samples.", "zh": "两者都用其他样本代替价值网络。"}}
    return {"reading_order": [step], "questions": [q]}


def write_bank(root: Path, docs: dict[str, dict], topics: dict | None = None) -> tuple[Path, Path]:
    bank_dir = root / "bank"
    bank_dir.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (bank_dir / f"{name}.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    topics_path = root / "topics.yaml"
    if topics is not None:
        topics_path.write_text(yaml.safe_dump(topics, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return bank_dir, topics_path


class FixtureBank:
    """A written fixture bank: `kwargs` go to build_bank/topics/build_site/quiz."""

    def __init__(self, root: Path, docs=None, topics=None):
        self.docs = copy.deepcopy(docs if docs is not None else bank_data())
        self.topics = copy.deepcopy(topics if topics is not None else topics_data())
        self.bank_dir, self.topics_path = write_bank(root, self.docs, self.topics)
        self.only = sorted(self.docs)

    @property
    def bank_kwargs(self):
        return dict(bank_dir=self.bank_dir, examples=EXAMPLES, only=self.only)


@pytest.fixture
def fixture_bank(tmp_path) -> FixtureBank:
    return FixtureBank(tmp_path / "fx")


@pytest.fixture
def make_bank(tmp_path):
    """make_bank(mutate) -> FixtureBank whose documents `mutate(docs, topics)` changed."""
    def make(mutate=None):
        docs, topics = bank_data(), topics_data()
        if mutate is not None:
            mutate(docs, topics)
        return FixtureBank(tmp_path / "mut", docs, topics)
    return make


@pytest.fixture(scope="session")
def real_site(tmp_path_factory):
    """The package's site as it stands, built once per test session (methods without a
    bank file yet are left out; the completeness tests in test_shipped_lessons.py fail
    for them)."""
    from policylab.learn import site

    out = tmp_path_factory.mktemp("real-site")
    site.build_site(out, complete=False)
    return out


@pytest.fixture(scope="session")
def fixture_site(tmp_path_factory):
    """(FixtureBank, output directory) of the site built once per session from the fixture
    bank (test_site.py reads its pages, test_browser.py opens them). Read only."""
    from policylab.learn import site

    root = tmp_path_factory.mktemp("site")
    fb = FixtureBank(root / "bank")
    index = site.build_site(root / "out", bank_dir=fb.bank_dir, examples=EXAMPLES, topics_path=fb.topics_path,
                            complete=False)
    return fb, index.parent
