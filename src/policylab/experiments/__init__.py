"""Experiments: several training runs side by side on one model, task and budget.

    compare.py  `policylab compare CONFIG`: methods x seeds, resumable, one report
"""
