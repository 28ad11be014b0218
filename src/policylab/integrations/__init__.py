"""Adapters that run policylab's methods inside distributed engines.

`policylab.integrations.verl` registers policylab's losses and advantage estimators in
verl (extra `policylab[verl]`); `policylab.integrations.trl` is a `GRPOTrainer` subclass
(extra `policylab[trl]`). Which methods an engine can host is computed from each
method's spec (`policylab.integrations.hosting`). Importing this package imports no
engine.
"""
