"""Run `policylab.learn.cli` over the fixture bank in a subprocess (real pipes, real EOF):

    python tests/learn/fixture_cli.py ROOT quiz --method rloo --seed 1 < answer.txt

writes the fixture bank under ROOT, points the package's bank, topics and examples at it,
then calls the same entry point the `policylab` command uses."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import conftest  # noqa: E402  (the fixture bank, no pytest needed to build it)

from policylab.learn import bank, index  # noqa: E402
from policylab.learn.cli import main  # noqa: E402
from policylab.learn.examples import EXAMPLES  # noqa: E402

fb = conftest.FixtureBank(Path(sys.argv[1]))
bank.BANK_DIR, bank.TOPICS_PATH = fb.bank_dir, fb.topics_path
index.BANK_DIR, index.TOPICS_PATH = fb.bank_dir, fb.topics_path  # what the quiz reads
EXAMPLES.update(conftest.EXAMPLES)
sys.exit(main(sys.argv[2:]))
