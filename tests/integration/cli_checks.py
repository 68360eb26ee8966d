"""Shared helpers of the CLI tests: run a command in-process, check a user error's shape, write labelled data."""
import csv

from typer.testing import CliRunner

from bertology.cli import app

runner = CliRunner()


def invoke(*args):
    """Run ``bertology ARGS...`` in-process (arguments may be paths or numbers)."""
    return runner.invoke(app, [str(a) for a in args])


def assert_user_error(result, *fragments):
    """Exit status 2, no traceback, and the message says what is wrong (every fragment appears)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    text = " ".join(result.output.split())
    assert "error:" in text
    for frag in fragments:
        assert frag in text, text


def labelled_csv(path, texts, labels):
    """``texts`` with their ``labels`` as a CSV with the columns ``text``, ``label``; returns ``path``."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        w.writerows(zip(texts, labels))
    return path
