"""``view``: write the interactive attention viewer of one model, or of two side by side, to one HTML file
(the work is :func:`bertology.commands.view.view`)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bertology.cli.app import app, user_errors
from bertology.cli.options import max_length_option, model_option, out_option


@app.command("view")
@user_errors
def view_command(
    text: str = typer.Argument(..., help="The sentence to show (sentence A)."),
    text_pair: Optional[str] = typer.Argument(None, help="Optional second sentence (B) of a pair."),
    model: str = model_option(help="Model to show: hub id, local folder, or 'minilm'."),
    compare: Optional[str] = typer.Option(
        None, "--compare", help="Second model (shown as 'tuned'; diff mode = it minus --model, shown as 'base')."
    ),
    out: Path = out_option(Path("view.html"), help="Output file: .html page, or .json for the data."),
    max_length: int = max_length_option(128, help="Refuse texts longer than this many tokens, [CLS]/[SEP] included.", min=2),
    attention_measures: str = typer.Option(
        "weights", "--attention-measures", metavar="NAME",
        help="The maps shown: weights (the probabilities), or one contribution measure of compare's "
        "--attention-measures (norm, norm_residual, rollout, value_zeroing, alti)."),
) -> None:
    """Interactive attention viewer (head view, model view, base/tuned/diff) as one offline HTML file."""
    from bertology.commands.view import view

    typer.echo(str(view(text, text_pair, model=model, compare=compare, out=out, max_length=max_length,
                        attention_measures=attention_measures).out))
