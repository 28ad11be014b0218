"""Experiments: several training runs side by side on one model, task and budget.

    compare/    `policylab compare CONFIG`: methods x seeds, resumable, one report
    exercise.py the settings under which a method does anything at all (its spec's `exercise`)
"""
