"""The README's methods table is generated from the registry; it must not go stale."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_methods_table_in_sync():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (ROOT / "README.md").read_text()
    assert mod.render(text) == text, "README methods table is stale: run .venv/bin/python scripts/update_readme.py"


def test_readme_names_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make quickstart" in text and "make test" in text
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_python_api_example_runs():
    import re

    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Python API\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    # the comment in the snippet states the hand-worked values: check them
    import torch

    torch.testing.assert_close(namespace["advantages"].grpo(namespace["rewards"], namespace["group"], std="unbiased"),
                               torch.tensor([1.5, -0.5, -0.5, -0.5]))
