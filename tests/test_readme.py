"""The README and the docs must stay true: the methods table is generated from the
registry, the count it states is the registry's, the layout is the real tree, the
Python example runs, and every relative link and repository path resolves."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TABLE = re.compile(r"<!-- METHODS-TABLE -->.*?<!-- /METHODS-TABLE -->", re.S)


def _readme_without_table() -> str:
    return TABLE.sub("", README.read_text())


def test_methods_table_in_sync():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = README.read_text()
    assert TABLE.search(text), "README has no <!-- METHODS-TABLE --> block"
    assert mod.render(text) == text, "README methods table is stale: run .venv/bin/python scripts/update_readme.py"


def test_readme_states_the_registry_count():
    from policylab import methods

    n = len(methods.names())
    text = _readme_without_table()
    stated = [int(x) for x in re.findall(r"\b(\d+) (?:registered )?methods\b", text)]
    stated += [int(x) for x in re.findall(r"\b(\d+) in the registry\b", text)]
    assert stated, "README states no method count"
    assert set(stated) == {n}, f"README states {sorted(set(stated))} methods; the registry has {n}"


def _layout_entries() -> list[str]:
    text = README.read_text()
    section = re.search(r"## Layout\n(.*?)(?=\n## |\Z)", text, re.S)
    assert section, "README has no ## Layout section"
    block = re.search(r"```\n(src/policylab/\n.*?)```", section.group(1), re.S)
    assert block, "the Layout section has no code block starting with src/policylab/"
    lines = block.group(1).splitlines()[1:]
    return [line.split()[0] for line in lines if re.match(r"  \S", line)]


def test_layout_lists_exactly_the_package_entries():
    src = ROOT / "src" / "policylab"
    listed = _layout_entries()
    assert len(listed) == len(set(listed)), f"an entry is listed twice: {listed}"
    for entry in listed:
        path = src / entry.rstrip("/")
        assert path.exists(), f"README layout lists {entry}, which src/policylab/ does not have"
        assert path.is_dir() == entry.endswith("/"), f"README layout: {entry} (a directory ends in '/', a file does not)"
    real = {p.name for p in src.iterdir() if p.name != "__pycache__" and not p.name.startswith(".")}
    assert {e.rstrip("/") for e in listed} == real, (
        f"README layout is not the tree: missing {sorted(real - {e.rstrip('/') for e in listed})}, "
        f"extra {sorted({e.rstrip('/') for e in listed} - real)}")


def test_readme_names_the_two_commands():
    text = README.read_text()
    assert "make quickstart" in text and "make test" in text
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert re.search(r"<!-- QUICKSTART-RESULTS -->.*\|.*<!-- /QUICKSTART-RESULTS -->", text, re.S)


def test_python_api_example_runs():
    import torch

    code = re.search(r"## Python API\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    # the comments in the snippet state the hand-worked values: check them
    torch.testing.assert_close(ns["adv"], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # ratio pi_theta / pi_old = 1 (no clip acts); TIS weight min(exp(0.1), 2) on every token
    expected = -ns["adv"].unsqueeze(-1) * torch.exp(torch.tensor(0.1)) * torch.ones(4, 3)
    torch.testing.assert_close(ns["loss"].detach(), expected)


def _links(page: Path) -> list[str]:
    text = page.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold commands, not links
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    bad = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists() or ROOT not in (path, *path.parents):
            bad.append(target)
    assert not bad, f"{page.relative_to(ROOT)}: links that do not resolve inside the repository: {bad}"


REPO_PATH = re.compile(r"`((?:src|tests|docs|configs|benchmarks|scripts|notes)/[^`\s]*)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_repository_paths_exist(page):
    """A path written in backticks (`src/policylab/...`, `tests/...`) names a real file or
    folder; `file.py::test_name` names a test in it. Patterns (`<name>`, `{md,json}`, `*`)
    and generated run output are not checked."""
    text = TABLE.sub("", page.read_text())
    bad = []
    for quoted in REPO_PATH.findall(text):
        if any(c in quoted for c in "<>{}*") or "NAME" in quoted:
            continue
        path, _, test = quoted.partition("::")
        if not (ROOT / path).exists():
            bad.append(quoted)
        elif test and not re.search(rf"def {re.escape(test)}\b", (ROOT / path).read_text()):
            bad.append(quoted)
    assert not bad, f"{page.relative_to(ROOT)}: paths that do not exist: {bad}"
