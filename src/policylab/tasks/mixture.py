"""Pooled data from several task domains (Mix RL): one train stream drawing each prompt's
domain by fixed proportions, every example tagged with its domain, and one held-out split
per domain (reports are per domain, never only an average).

    DOMAINS          the domain names an example's meta["domain"] may take
    domain_index(e)  its index in DOMAINS (arithmetic examples carry no tag: "arithmetic")
"""

from __future__ import annotations

from policylab.errors import PolicylabError
from policylab.tasks.arithmetic import ArithmeticTask, hash_ints
from policylab.tasks.example import Example
from policylab.tasks.sequence import SequenceTask

DOMAINS = ("arithmetic", "sequence")


def domain_of(example: Example) -> str:
    """The example's domain: its meta["domain"], or "arithmetic" for an untagged example of
    the arithmetic task (its operands in meta); anything else is refused, never guessed."""
    meta = example.meta or {}
    if "domain" in meta:
        return str(meta["domain"])
    if {"op", "a", "b"} <= set(meta):
        return "arithmetic"
    raise PolicylabError(f"example {example.prompt[:50]!r} carries no domain tag (meta['domain']); the per-domain "
                         "methods need task.name=mixture or sequence (or arithmetic)")


def domain_index(example: Example) -> int:
    d = domain_of(example)
    if d not in DOMAINS:
        raise PolicylabError(f"unknown domain {d!r}; domains are {', '.join(DOMAINS)}")
    return DOMAINS.index(d)


def domain_task(name: str, *, seed: int, ops=("+", "*"), digits: int = 1, heldout_fraction: float = 0.5,
                split_seed: int = 0):
    if name == "arithmetic":
        return ArithmeticTask(ops=tuple(ops), digits=digits, seed=seed, heldout_fraction=heldout_fraction,
                              split_seed=split_seed)
    if name == "sequence":
        return SequenceTask(seed=seed, heldout_fraction=heldout_fraction, split_seed=split_seed)
    raise PolicylabError(f"unknown domain {name!r}; domains are {', '.join(DOMAINS)}")


class MixtureTask:
    """Train prompts pooled from `domains` in proportions `mix` (a seeded draw per stream
    position); `heldout(n)` alternates the domains' held-out splits; `heldout_of(d, n)`
    gives one domain's."""

    def __init__(self, domains, mix, *, seed: int = 0, ops=("+", "*"), digits: int = 1, heldout_fraction: float = 0.5,
                 split_seed: int = 0):
        domains, mix = tuple(domains), tuple(float(x) for x in mix)
        if not domains or len(set(domains)) != len(domains):
            raise PolicylabError(f"task.domains must name distinct domains, got {domains}")
        if len(mix) != len(domains) or any(x < 0 for x in mix) or sum(mix) <= 0:
            raise PolicylabError(f"task.mix must give one non-negative proportion per domain, got {mix} for {domains}")
        self.domains, self.seed = domains, int(seed)
        total = sum(mix)
        self.cum = [sum(mix[: i + 1]) / total for i in range(len(mix))]
        unknown = [d for d in domains if d not in DOMAINS]
        if unknown:
            raise PolicylabError(f"unknown domains {unknown}; domains are {', '.join(DOMAINS)}")
        self.mix = tuple(x / total for x in mix)
        self.tasks = {d: domain_task(d, seed=seed, ops=ops, digits=digits, heldout_fraction=heldout_fraction,
                                     split_seed=split_seed) for d in domains}
        self.position = 0

    def train_prompts(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            u = hash_ints(f"policylab-mix:{self.seed}:{self.position}", 1)[0] / 2**64
            d = next(dd for dd, c in zip(self.domains, self.cum) if u < c or c == self.cum[-1])  # P(d) = mix[d]
            ex = self.tasks[d].train_prompts(1)[0]
            out.append(Example(ex.prompt, ex.answer, {**ex.meta, "domain": d}))
            self.position += 1
        return out

    def heldout_of(self, domain: str, n: int) -> list[Example]:
        return [Example(e.prompt, e.answer, {**e.meta, "domain": domain})
                for e in self.tasks[domain].heldout(n, repeat=True)]

    def heldout(self, n: int, *, repeat: bool = True) -> list[Example]:
        per = {d: self.heldout_of(d, n) for d in self.domains}
        return [per[self.domains[j % len(self.domains)]][j // len(self.domains)] for j in range(n)]

    def heldout_size(self) -> int | None:
        """Distinct held-out problems over the domains (None when a domain's space is too
        large to list, as `ArithmeticTask.heldout_size`)."""
        sizes = [t.heldout_size() for t in self.tasks.values()]
        return None if any(x is None for x in sizes) else sum(sizes)

    def state_dict(self) -> dict:
        return {"position": self.position, "domains": list(self.domains), "mix": list(self.mix),
                "tasks": {d: t.state_dict() for d, t in self.tasks.items()}}

    def load_state_dict(self, state: dict) -> None:
        if list(state.get("domains", [])) != list(self.domains):
            raise PolicylabError(f"task state was saved for domains {state.get('domains')}, this task has {self.domains}")
        if [round(x, 12) for x in state.get("mix", [])] != [round(x, 12) for x in self.mix]:
            raise PolicylabError(f"task state was saved for the mix {state.get('mix')}, this task has {list(self.mix)}")
        self.position = int(state["position"])
        for d, t in self.tasks.items():
            t.load_state_dict(state["tasks"][d])
