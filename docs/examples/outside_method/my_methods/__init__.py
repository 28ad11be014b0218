"""An example of a policylab method that lives outside the policylab package."""
