"""The method: its stage (binding the kernel to the method's parameter) and its registration.

A run names it by import path: `method: my_methods.family:CAPPED_PG`.
"""

from __future__ import annotations

from policylab.methods.params import group_std, on_policy_only, policy_gradient_method, positive
from policylab.methods.spec import Card, Param, Stage
from policylab.methods.stages import advantages as adv

from my_methods.capped_pg import capped_pg


def _objective(inp, p):
    return capped_pg(inp.logp, inp.adv, inp.mask, cap=p.adv_cap)


CAPPED_PG_OBJECTIVE = Stage("objective", _objective, name="capped_pg", kernels=(capped_pg,), params=("adv_cap",),
                            reads=("logp",), inert_at_zero_adv=True)

CAPPED_PG = policy_gradient_method(
    "capped_pg",
    Card(title="Capped policy gradient (an example, not a paper)", arxiv="", family="objective",
         samples="π_θ (the rollout engine at the current weights)", learns="π_θ", reference="none",
         summary="REINFORCE on group-standardized advantages capped at ±adv_cap",
         not_established="anything: it exists to show a method defined outside policylab"),
    advantage=adv.GRPO, objective=CAPPED_PG_OBJECTIVE, aggregation="token_mean",
    params=(Param("adv_cap", float, 1.0, "cap on |A|", check=positive),) + group_std(),
    checks=(on_policy_only("capped_pg has no ratio to correct a second update with"),),
)
