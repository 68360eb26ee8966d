"""mkdocs hooks for bertology's site.

- ``<!-- bertology-help: CMD [SUB] -->`` in a page becomes that command's ``--help``, run at build time, so
  the CLI reference cannot drift from the flags the commands take.
- Notebook pages (``tutorials/*.ipynb``): mkdocs-jupyter leaves their relative links to other pages as
  written (``../studies.md``), which do not exist in the site; they are rewritten to the pages' URLs, and a link
  to a page that does not exist fails the build (as ``--strict`` does for Markdown pages).
- ``<!-- bertology-settings: NAME -->`` becomes a table of the settings that spec (an analysis or experiment of
  ``compare``, or ``run`` / ``data`` for the run's own) declares: flag, Python name, default, allowed values,
  paper and help, generated from the declarations as the flags are.
- ``<!-- bertology-recipe: TASK -->`` becomes the table of that task's recipe (its fine-tuning defaults, each
  with its source, and the figure it reached here), from :data:`bertology.training.recipes.RECIPES`.
- Tutorials run without progress bars (``BERTOLOGY_PROGRESS=0`` for the kernels, unless set): bars drawn into a
  notebook's outputs would be kept in the page.
- The site must read offline: after the build, any page that loads a script, stylesheet or font from
  another host fails it (nbconvert's notebook template leaves an empty MathJax ``<script src="">``,
  which is removed).
"""
from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

MARKER = re.compile(r"<!--\s*bertology-help:\s*([a-z][a-z _-]*?)\s*-->")
WIDTH = 140  # wide enough that rich truncates no flag name or default (checked on every command)
SETTINGS = re.compile(r"<!--\s*bertology-settings:\s*([a-z_]+)\s*-->")
RECIPE = re.compile(r"<!--\s*bertology-recipe:\s*([a-z_]+)\s*-->")
EMPTY_SCRIPT = re.compile(r'<script src="">\s*</script>')
NB_LINK = re.compile(r'href="(?![a-z][a-z0-9+.-]*:|#|/)([^"#]+\.(?:md|ipynb))(#[^"]*)?"')
_FILES: dict = {}
REMOTE = re.compile(r'<(?:script|img|iframe)\b[^>]*\bsrc="(?:https?:)?//|<link\b[^>]*\bhref="(?:https?:)?//')


def on_startup(**_: object) -> None:
    """No progress bars in the executed tutorials (the kernels inherit this environment)."""
    os.environ.setdefault("BERTOLOGY_PROGRESS", "0")


def _help(args: list[str]) -> str:
    from typer.testing import CliRunner

    from bertology.cli import app

    result = CliRunner().invoke(app, [*args, "--help"], terminal_width=WIDTH,
                                env={"COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"})
    if result.exit_code != 0:
        raise RuntimeError(f"bertology {' '.join(args)} --help exited {result.exit_code}: {result.output}")
    if "\u2026" in result.output:  # rich shortened something: the reference would hide part of a flag
        raise RuntimeError(f"bertology {' '.join(args)} --help is truncated at width {WIDTH}; widen WIDTH")
    lines = [line.rstrip() for line in result.output.strip("\n").splitlines()]
    return "\n".join(lines).strip("\n")


def _cell(value) -> str:
    text = "" if value is None else (",".join(map(str, value)) if isinstance(value, tuple) else str(value))
    return text.replace("|", "\\|")


def _settings_table(owner: str) -> str:
    """The declared settings of ``owner`` (a spec, or ``run`` / ``data``) as a markdown table."""
    from bertology.cli.commands import compare_settings

    groups = dict(compare_settings())
    if owner not in groups:
        raise RuntimeError(f"bertology-settings: no spec or group {owner!r}; known: {', '.join(groups)}")
    rows = ["| flag | Python name | default | allowed | paper | what it does |", "|---|---|---|---|---|---|"]
    for s in groups[owner]:
        allowed = " / ".join(s.choices) if s.choices else (f">= {s.minimum:g}" if s.minimum is not None else "")
        default = "not given" if s.default is None else _cell(s.default)
        rows.append(f"| `{s.cli_flag}` | `{s.name}` | {default} | {_cell(allowed)} | {_cell(s.paper)} | {_cell(s.help)} |")
    return "\n".join(rows)


def _recipe_table(task: str) -> str:
    """A task's recipe (its defaults and their sources) as a markdown table (bertology.training.recipes)."""
    from bertology.training.recipes import RECIPES, recipe_table

    if task not in RECIPES:
        raise RuntimeError(f"bertology-recipe: no recipe {task!r}; known: {', '.join(RECIPES)}")
    return recipe_table(task)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    markdown = SETTINGS.sub(lambda m: _settings_table(m.group(1)), markdown)
    markdown = RECIPE.sub(lambda m: _recipe_table(m.group(1)), markdown)
    return MARKER.sub(lambda m: "```text\n" + _help(m.group(1).split()) + "\n```", markdown)


def on_files(files, config):  # noqa: ARG001
    _FILES.clear()
    _FILES.update({f.src_uri: f for f in files})
    return files


def _notebook_links(output: str, page) -> str:
    """A notebook page's relative ``.md``/``.ipynb`` links, as the URLs of the pages they name."""
    from mkdocs.utils import get_relative_url

    source = page.file.src_uri
    missing = []

    def fix(m: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(source), m.group(1)))
        file = _FILES.get(target)
        if file is None:
            missing.append(m.group(1))
            return m.group(0)
        return f'href="{get_relative_url(file.url, page.url)}{m.group(2) or ""}"'

    output = NB_LINK.sub(fix, output)
    if missing:
        raise RuntimeError(f"{source} links to pages that do not exist: {', '.join(sorted(set(missing)))}")
    return output


def on_post_page(output: str, page, config) -> str:  # noqa: ARG001
    if page.file.src_uri.endswith(".ipynb"):
        output = _notebook_links(output, page)
    return EMPTY_SCRIPT.sub("", output)


def on_post_build(config) -> None:
    remote = []
    for html in Path(config["site_dir"]).rglob("*.html"):
        for match in REMOTE.finditer(html.read_text(encoding="utf-8")):
            remote.append(f"{html.relative_to(config['site_dir'])}: {match.group(0)[:120]}")
    if remote:
        raise RuntimeError("pages load assets from other hosts (the site must read offline):\n" + "\n".join(remote))
