"""Method families: each module registers the methods of one family, by content.

Importing `policylab.methods` imports every module here, so every registration runs.
"""
