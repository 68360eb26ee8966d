"""The run lifecycle lives in one room: only ``commands/base.py`` opens a run folder (``runs.open_run``)."""
from __future__ import annotations

import re
from pathlib import Path

import bertology

SRC = Path(bertology.__file__).parent
#: The modules allowed to call ``open_run(``: its definition and the lifecycle's ``hold``.
OPENERS = {"runs.py", "commands/base.py"}


def test_only_the_lifecycle_opens_a_run_folder():
    callers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if re.search(r"\bopen_run\(", p.read_text(encoding="utf-8")))
    assert set(callers) <= OPENERS, f"open_run( called outside the lifecycle: {sorted(set(callers) - OPENERS)}; " \
                                    "take the folder with bertology.commands.base.hold or write a Command"
    assert "commands/base.py" in callers  # the check reads the right files
