"""Multi-stage pipelines: `policylab pipeline NAME CONFIG`. Each stage is a training run or
a model operation whose output the next stage loads, all under the pipeline's run
directory, with one report.

    common.py     what the pipelines share: config sections, sampling, run directory rules
    rlhf.py       ppo_rlhf: SFT -> reward model -> PPO (rlhf_eval.py: its evaluation, report)
    fusion.py     fusion: domain experts -> Merge / Mix RL / MOPD

PIPELINES is the registry the command line reads: name -> Pipeline (the entry function,
which reads a config file, runs the pipeline and returns its run directory, and a
one-line description). A new pipeline is a module with such a function and one entry
here; the command line never names a pipeline itself.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from policylab.errors import ConfigError
from policylab.pipelines import fusion, rlhf


@dataclass(frozen=True)
class Pipeline:
    """`entry(config_path, overrides, *, console, overwrite) -> run_dir`: the config read
    and checked (overrides: "key=value" strings), the pipeline run, its report written
    to run_dir/report.json and report.md."""
    entry: Callable[..., Path]
    description: str


PIPELINES: dict[str, Pipeline] = {
    "ppo_rlhf": Pipeline(rlhf.run_config_file, "SFT -> reward model -> PPO"),
    "fusion": Pipeline(fusion.run_config_file, "domain experts -> Merge / Mix RL / MOPD"),
}


def get_pipeline(name: str) -> Pipeline:
    """The registered pipeline `name`; an unknown name is refused with the close matches
    and the list of pipelines."""
    try:
        return PIPELINES[name]
    except KeyError:
        near = difflib.get_close_matches(str(name), list(PIPELINES), n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise ConfigError(f"unknown pipeline {name!r}.{hint} The pipelines: {', '.join(PIPELINES)}.") from None


__all__ = ["PIPELINES", "Pipeline", "get_pipeline"]
