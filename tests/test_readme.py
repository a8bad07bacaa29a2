"""The README is user documentation (STYLE.md): it stays short, its two commands stay
the ones CI runs, and its links and the docs' links lead somewhere. Figures and long
reference material live in docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 300
INSTALL_AND_RUN = 'pip install . && dualpath run "Once upon a time"'
TEST_COMMAND = 'pip install ".[test]" && python -m pytest tests'


def test_the_readme_fits_its_line_budget():
    lines = README.read_text(encoding="utf-8").count("\n")
    print(f"\nREADME.md: {lines} lines (budget {MAX_README_LINES})")
    assert lines <= MAX_README_LINES, (f"README.md has {lines} lines, the budget is {MAX_README_LINES}: move "
                                       "figures to docs/performance.md and reference material to docs/")


def test_the_two_commands_are_in_the_readme_and_ci_runs_the_test_command():
    text = README.read_text(encoding="utf-8")
    assert f"```bash\n{INSTALL_AND_RUN}\n```" in text
    assert f"```bash\n{TEST_COMMAND}\n```" in text
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.MULTILINE)}


def test_relative_links_in_the_readme_and_docs_lead_to_a_file_and_heading():
    broken = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target}: no such heading")
    assert not broken, "\n".join(broken)
