"""Code says what it does and why, not which ticket asked for it: no issue numbers in src (comments, docstrings or
strings); the history is in git and the CHANGELOG."""
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "bertology"
ISSUE = re.compile(r"\b[Ii]ssues? \d+")


def test_no_issue_numbers_in_src():
    found = [f"{p.relative_to(SRC)}:{n}" for p in sorted(SRC.rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if ISSUE.search(line)]
    assert not found, f"issue numbers in src: {found}"


def test_the_pattern_finds_one():
    assert ISSUE.search("# the device path (issue 35)") and not ISSUE.search("# the device path")
