"""The math needs only torch: importing it must not pull transformers, peft or rich."""

import subprocess
import sys


def test_math_imports_need_only_torch():
    code = (
        "import sys\n"
        "import policylab\n"
        "from policylab import advantages, objectives, corrections, kl, aggregate, methods, RolloutBatch\n"
        "methods.get('grpo')\n"
        "heavy = [m for m in ('transformers', 'peft', 'rich', 'matplotlib', 'safetensors') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported by the math: {out.stdout.strip()}"
