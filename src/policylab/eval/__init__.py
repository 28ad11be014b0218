"""Evaluation: held-out accuracy and pass@k, the sharpening tax, decision-token
calibration, and the metric cards listed beside the methods.

    evaluate.py     held-out accuracy, unbiased pass@k and mean length of one model
    suite.py        `policylab eval --metrics`: coverage, sharpening tax, calibration, base vs trained
    coverage.py     fixed-budget coverage and the sharpening tax
    calibration.py  decision-token calibration: a fitted temperature, ECE and Brier
    cards.py        metric cards (`policylab methods calib_rl`)
"""
