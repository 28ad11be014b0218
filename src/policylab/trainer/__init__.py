"""The trainer: a thin loop over the stages of whatever method it is given, and what a
run needs around it (configuration, checkpoints, logs, resume, memory and thread
settings).

    loop.py        `Trainer`: collect -> role passes -> rounds -> advantages -> updates -> sync
    rollout.py     one training batch: the method's source -> rewards -> filters (refilled)
    run.py         `policylab train` / `resume`: start-up summary, evaluations, report
    config.py      `RunConfig`: one flat dataclass per component, validated on load
    checkpoint.py  atomic checkpoints: weights + full training state, read without pickle
    safestate.py   training state on disk as safetensors + JSON (an allow-list, no pickle)
    runlog.py      metrics.jsonl, TensorBoard and plots of a run
    memory.py      the memory a step will need, estimated before it samples
    runtime.py     process-wide settings applied at start-up (threads, allocator)
    allocator.py   glibc's tcache and fast bins off: the `policylab` command restarts itself once
    support.py     learning-rate schedule, seeding, engine construction, run config IO
"""

