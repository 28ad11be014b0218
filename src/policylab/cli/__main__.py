"""`python -m policylab.cli ...`: the same as the `policylab` command."""

import sys

from policylab.cli import main

sys.exit(main())
