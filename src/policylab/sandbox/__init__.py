"""The sandbox for model-written code: one separate, walled-in process per candidate.

    runner.py  the parent side: limits, the child's start, what comes back
    child.py   the process that runs one candidate (started by runner.py only)
"""



