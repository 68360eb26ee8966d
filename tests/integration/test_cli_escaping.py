"""User text reaches the terminal literally: square brackets in errors and paths are not rich markup."""
from typer.testing import CliRunner

from bertology.cli import app


def test_an_error_keeps_its_square_brackets(tmp_path):
    missing = tmp_path / "[red]data[/red].csv"
    result = CliRunner().invoke(app, ["compare", "--tuned", "minilm", "--data", str(missing), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "[red]data[/red].csv" in result.output.replace("\n", "")  # unescaped, rich would print "data.csv"
