"""The public functions' keywords, generated from the declared settings, for ``help()``, IDEs and the API reference.

``bt.compare(..., **settings)`` accepts every declared setting by name, but a bare ``**settings`` shows none of them.
Reading the declarations means importing every analysis (torch included, seconds), too slow for ``import
bertology``; so this module writes them once into :mod:`bertology.keywords` (plain Python: ``TypedDict`` classes an
IDE reads through ``Unpack``, and each keyword's annotation and default), and :mod:`bertology.api` turns those into
each function's ``__signature__`` at import. ``tests/house/test_keywords_current.py`` fails when a declaration
changes and the file was not regenerated:

    python -m bertology.signatures        # rewrite src/bertology/keywords.py

The keywords mirror how :func:`bertology.api._split` shares keywords out: a group's declared settings (or, for a
group that declares none, its dataclass fields), under the keyword the function takes (``text_column`` for ablate's
``Columns.text``); a name met twice keeps its first group.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from bertology.settings import Setting, field_settings

#: The generated module.
KEYWORDS_FILE = Path(__file__).with_name("keywords.py")
#: The keywords the public functions take themselves (never repeated from a group).
_OWN = {"compare": ("base", "tuned", "data", "analyses", "out", "report", "overwrite", "progress"),
        "finetune": ("model", "data", "out", "eval_data", "report", "overwrite", "progress"),
        "ablate": ("model", "data", "base", "out", "report", "overwrite", "progress"),
        "probe": ("base", "train", "test", "tuned", "dev", "random_control", "out", "report", "overwrite", "progress"),
        "absa": ("data", "base", "tuned", "out", "report", "overwrite", "progress"),
        "track": ("run", "data", "base", "overwrite", "progress")}


def setting_annotation(s: Setting) -> str:
    """A setting's type as source text: its kind, its choices as a ``Literal``, ``| None`` when None is allowed."""
    literal = f"Literal[{', '.join(repr(c) for c in s.choices)}]" if s.choices else None
    if s.kind is tuple:
        text = f"tuple[{literal or 'str'}, ...] | str"  # a tuple, or the command line's comma list
    elif s.kind is float:
        text = "float | int"
    else:
        text = literal if literal and s.kind is str else s.kind.__name__
    return f"{text} | None" if s.optional else text


def _field_keywords(group: type) -> list[tuple[str, str, object]]:
    """A dataclass without declared settings: every field, with its annotation and default."""
    out = []
    for f in dataclasses.fields(group):
        default = f.default if f.default is not dataclasses.MISSING else None
        out.append((f.name, str(f.type), default))
    return out


def group_keywords(groups: Iterable[type], renames: Mapping[str, str] | None = None,
                   extra: Sequence[Setting] = (), skip: Sequence[str] = ()) -> list[tuple[str, str, object]]:
    """``(keyword, annotation, default)`` of every setting the groups (then ``extra``) declare, as the function takes
    them (``renames``: keyword -> field), first group first; names in ``skip`` left out."""
    inverse = {field: key for key, field in (renames or {}).items()}
    taken, out = set(skip), []
    for group in groups:
        declared = field_settings(group)
        rows = [(s.name, setting_annotation(s), s.default) for s in declared] if declared else _field_keywords(group)
        for name, annotation, default in rows:
            key = inverse.get(name, name)
            if key not in taken and not key.startswith("_"):
                taken.add(key)
                out.append((key, annotation, default))
    for s in extra:
        if s.name not in taken:
            taken.add(s.name)
            out.append((s.name, setting_annotation(s), s.default))
    return out


def public_keywords() -> dict[str, list[tuple[str, str, object]]]:
    """Every public function's keywords by function name (imports every declaring module)."""
    from bertology.config import CompareConfig, DataConfig, FinetuneConfig
    from bertology.experiments.ablation import AblationSettings
    from bertology.experiments.probe import ProbeSettings
    from bertology.experiments.token_probe import TokenProbeSettings
    from bertology.commands.selection import declared_settings
    from bertology.commands.ablate import QaOptions
    from bertology.commands.absa import AbsaConfig
    from bertology.commands.inputs import Columns, Loading
    from bertology.commands.probe import ProbeData, ProbeOptions
    from bertology.commands.track import TrackSettings

    declared, _ = declared_settings()
    columns = {"text_column": "text", "pair_column": "pair", "label_column": "label"}
    groups = {"compare": ((CompareConfig, DataConfig), {}, tuple(declared.values())),
              "finetune": ((DataConfig, FinetuneConfig), {}, ()),
              "ablate": ((AblationSettings, Columns, QaOptions, Loading), columns, ()),
              "probe": ((ProbeSettings, TokenProbeSettings, ProbeData, ProbeOptions, Loading), {}, ()),
              "absa": ((AbsaConfig,), {}, ()),
              "track": ((TrackSettings,), {}, ())}
    return {name: group_keywords(g, renames, extra, skip=_OWN[name] + ("data", "train", "test", "dev", "out",
                                                                       "model", "base", "tuned", "report"))
            for name, (g, renames, extra) in groups.items()}


def _class_name(function: str) -> str:
    return f"{function.capitalize()}Keywords"


def render(keywords: Mapping[str, list[tuple[str, str, object]]]) -> str:
    """The text of :mod:`bertology.keywords` for ``keywords``, with tracking's choices read from the specs."""
    from bertology.reach import catalog_entries, declared

    tracked, entries = tuple(declared("track")), catalog_entries("track")
    lines = ['"""Generated by ``python -m bertology.signatures`` from the declared settings: do not edit.',
             "",
             "One ``TypedDict`` per public function (``bt.compare(..., **settings: Unpack[CompareKeywords])``) for IDEs, and",
             "``KEYWORDS``: each keyword's annotation and default, which :mod:`bertology.api` makes into ``__signature__``.",
             '"""',
             "from __future__ import annotations",
             "",
             "from typing import Literal, TypedDict",
             ""]
    for function, rows in keywords.items():
        lines += ["", f"class {_class_name(function)}(TypedDict, total=False):",
                  f'    """The keywords of ``bertology.{function}`` beyond its own parameters."""', ""]
        lines += [f"    {name}: {annotation}" for name, annotation, _ in rows]
        lines.append("")
    lines += ["", "#: function -> ((keyword, annotation, default), ...)", "KEYWORDS = {"]
    for function, rows in keywords.items():
        lines.append(f"    {function!r}: (")
        lines += [f"        ({name!r}, {annotation!r}, {default!r})," for name, annotation, default in rows]
        lines.append("    ),")
    lines.append("}")
    lines += ["", "#: The analyses whose spec declares ``track`` (tracking's choices), and the catalog names they were read",
              "#: from: :func:`bertology.reach.tracked_names` uses them while the catalogs are unchanged (no analysis imported).",
              f"TRACKABLE = {tracked!r}", "TRACKABLE_FROM = ("]
    lines += [f"    {entry!r}," for entry in entries]
    lines.append(")")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite :data:`KEYWORDS_FILE` (``--check``: exit 1 when it is not current)."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = render(public_keywords())
    if "--check" in args:
        current = KEYWORDS_FILE.read_text(encoding="utf-8") if KEYWORDS_FILE.exists() else ""
        return 0 if current == text else 1
    KEYWORDS_FILE.write_text(text, encoding="utf-8")
    print(f"wrote {KEYWORDS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
