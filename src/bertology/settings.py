"""Settings declared once: name, default, allowed values, help, the paper it follows.

Each analysis, experiment and command declares the settings it reads as :class:`Setting` records (an
analysis in its spec, the run itself as fields of :class:`~bertology.config.CompareConfig` made with
:func:`setting_field`). Everything else is generated from those declarations: the command line's
flags with their help and defaults (``bertology.cli.generated``), the validation a Python caller gets
(:meth:`Setting.check`, so Python and the CLI refuse the same values with the same line), the
manifest's ``settings`` section (:func:`describe`), the fingerprint (settings with
``changes_numbers``) and the report's settings table.

This module sits on the ground floor: it imports nothing of bertology but the error type, so the
declarations can be read without torch.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bertology.errors import BertologyError, did_you_mean, each_with_suggestion, format_bound

#: The plain kinds a setting's value can have (a tuple is a comma list on the command line).
KINDS = (bool, int, float, str, tuple)


@dataclass(frozen=True)
class Setting:
    """One user-facing setting, declared where it is used and nowhere else.

    ``kind``: bool, int, float, str or tuple (inferred from ``default`` when that is not None);
    ``choices``: the allowed values of a str, or of every item of a tuple; ``minimum``/``maximum``: bounds
    of a number (of a tuple: its number of items); ``above``/``below``: strict bounds of a number;
    ``optional``: None is allowed (a None default implies it: "not given", e.g. "the preset's");
    ``zero_is_none``: 0 means "not set" (e.g. "0 = all"), read as None before the bounds are checked;
    ``parse``: command-line text -> value, for values that are not one plain kind (its errors are
    reported as this setting's); a str setting's ``parse`` checks its text (or a mapping given in Python, as a
    label map may be) and returns the canonical text, and must give that text back unchanged; ``changes_numbers``: in the fingerprint (False: where or how results
    are shown, never what they are); ``paper``: the publication the setting or its default follows;
    ``flag``: the command-line spelling when it is not ``--`` + the name with dashes; ``added``: declared after run
    folders were written without it, so at its default it stays out of the fingerprint (those folders still resume).
    """

    name: str
    default: Any
    help: str
    kind: type | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    below: float | None = None
    optional: bool = False
    zero_is_none: bool = False
    parse: Callable[[str], Any] | None = None
    changes_numbers: bool = True
    paper: str | None = None
    flag: str | None = None
    metavar: str | None = None
    added: bool = False

    def __post_init__(self) -> None:
        if self.kind is None:
            if self.default is None:
                raise ValueError(f"setting {self.name!r}: a None default needs an explicit kind")
            object.__setattr__(self, "kind", tuple if isinstance(self.default, (tuple, list)) else type(self.default))
        if self.kind not in KINDS:
            raise ValueError(f"setting {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.default is None or self.zero_is_none:
            object.__setattr__(self, "optional", True)
        if self.default is not None:
            self.check(self.default)  # a declaration whose own default is invalid is a bug, caught at import

    @property
    def cli_flag(self) -> str:
        """The flag, e.g. ``--rsa-tokens``."""
        return self.flag or "--" + self.name.replace("_", "-")

    def refuse(self, what: str, value: Any, hint: str = "") -> BertologyError:
        """The one-line error for ``value``: ``--flag (name) <what>, not <value><hint>.`` (for a check no field
        expresses; ``hint``: e.g. :func:`~bertology.errors.did_you_mean`'s)."""
        return BertologyError(f"{self.cli_flag} ({self.name}) {what}, not {value!r}{hint}.")

    @property
    def flag_name(self) -> str:
        """The flag's spelling as a Python name (``lr`` for ``--lr``): Python takes a setting by it too."""
        return self.cli_flag[2:].replace("-", "_")

    def check(self, value: Any) -> Any:
        """``value`` made canonical (an int for a float setting becomes a float, a list a tuple), or one
        :class:`BertologyError` line naming the flag and the Python name."""
        if value is None:
            if self.optional:
                return None
            raise self.refuse("needs a value", value)
        if self.parse is not None and (isinstance(value, (str, Mapping)) if self.kind is str else isinstance(value, str)):
            try:
                value = self.parse(value)
            except (ValueError, TypeError) as err:
                raise self.refuse(str(err).rstrip(".") or "cannot be read", value) from None
            if value is None and self.optional:  # e.g. "all" layers
                return None
        value = self._of_kind(value)
        if self.zero_is_none and value == 0 and not isinstance(value, bool):
            return None
        if self.choices is not None:
            for item in value if self.kind is tuple and isinstance(value, tuple) else (value,):
                if item not in self.choices:
                    raise self.refuse(f"must be one of {', '.join(self.choices)}", item, did_you_mean(item, self.choices))
        if self.kind is tuple and isinstance(value, tuple):
            if self.minimum is not None and len(value) < self.minimum:
                raise self.refuse(f"must name at least {self.minimum:g} item{'s' * (self.minimum != 1)}", value)
            if self.maximum is not None and len(value) > self.maximum:
                raise self.refuse(f"must name at most {self.maximum:g} item{'s' * (self.maximum != 1)}", value)
        if self.kind in (int, float):
            self._in_bounds(value)
        return value

    def _in_bounds(self, value: float) -> None:
        if self.minimum is not None and value < self.minimum:
            zero = f", or 0 for {self.zero_means}" if self.zero_is_none and self.minimum > 0 else ""
            raise self.refuse(f"must be at least {format_bound(self.minimum)}{zero}", value)
        if self.maximum is not None and value > self.maximum:
            raise self.refuse(f"must be at most {format_bound(self.maximum)}", value)
        if self.above is not None and not value > self.above:
            raise self.refuse(f"must be above {self.above:g}", value)
        if self.below is not None and not value < self.below:
            raise self.refuse(f"must be below {self.below:g}", value)

    @property
    def zero_means(self) -> str:
        """What 0 stands for in a ``zero_is_none`` setting, as its help says it (``(0 = all)``, ``0 or not given:
        auto``); "none" when the help does not say."""
        found = re.search(r"\b0 = ([^),;.]+)|\b0 or not given: ([^),;.]+)", self.help)
        return (found.group(1) or found.group(2)).strip() if found else "none"

    def _of_kind(self, value: Any) -> Any:
        kind = self.kind
        if kind is bool:
            if isinstance(value, bool):
                return value
            raise self.refuse("must be true or false", value)
        if kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return int(value)
            raise self.refuse("must be a whole number", value)
        if kind is float:  # an int given for a float is made a float: 1 and 1.0 are one run (one fingerprint)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value):
                    raise self.refuse("must be a finite number", value)
                return float(value)
            raise self.refuse("must be a number", value)
        if kind is str:
            if isinstance(value, str):
                return value
            if isinstance(value, os.PathLike):  # a file setting given as a Path, as data= and out= may be
                return os.fspath(value)
            raise self.refuse("must be text", value)
        if isinstance(value, (list, tuple)):
            return tuple(value)
        if self.parse is not None:  # e.g. a count where a list of indices is also accepted
            return value
        raise self.refuse("must be a list", value)

    def describe(self, value: Any) -> dict:
        """The manifest's record of this setting: its value beside its declaration."""
        return {"value": list(value) if isinstance(value, tuple) else value,
                "default": list(self.default) if isinstance(self.default, tuple) else self.default,
                "flag": self.cli_flag, "help": self.help, "paper": self.paper, "changes_numbers": self.changes_numbers}


def setting_field(default: Any, help: str, *, keyword: str | None = None, **declaration: Any) -> Any:  # noqa: A002
    """A dataclass field that is also a :class:`Setting`; see :func:`field_settings`. Its name is the field's, or in a
    settings group (:func:`group_field`) the group's ``keyword_prefix`` + the field's (``lora_`` + ``rank``), or
    ``keyword``: the flat name the command line, Python's keywords, the manifest and the fingerprint know it by."""
    factory = (lambda: default) if isinstance(default, (list, dict)) else None
    meta: dict[str, Any] = {"setting": dict(default=default, help=help, **declaration)}
    if keyword is not None:
        meta["keyword"] = keyword
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


#: The seeds numpy's and torch's generators both accept (numpy: 0 .. 2**32 - 1).
SEED_MAXIMUM = 2**32 - 1


def seed_field(help: str, default: int = 0) -> Any:  # noqa: A002 - the declaration's word
    """A seed setting: an int every generator bertology seeds accepts, refused outside that range up front."""
    return setting_field(default, help, minimum=0, maximum=SEED_MAXIMUM)


def group_field(group: type) -> Any:
    """A dataclass field holding a settings group: a frozen dataclass of :func:`setting_field` fields that one concern
    reads (``FinetuneConfig.lora``). Its settings stay flat everywhere a user meets them: :func:`field_settings` of
    the owner lists them by their flat names, :func:`grouped_init` takes them as flat keywords, :func:`flat_values`
    gives them back flat (the manifest, the fingerprint)."""
    return dataclasses.field(default_factory=group, metadata={"group": group})


@functools.cache
def declared_fields(cls: type) -> tuple[tuple[str | None, str, Setting], ...]:
    """``(group, attribute, Setting)`` of every :func:`setting_field` of dataclass ``cls`` in field order, a group's
    (:func:`group_field`) in its place with the group's field name (``("lora", "rank", <lora_rank>)``); ``group`` is
    None for the class's own fields. Made once per class."""
    prefix = getattr(cls, "keyword_prefix", "")
    out: list[tuple[str | None, str, Setting]] = []
    for f in dataclasses.fields(cls):
        if "group" in f.metadata:
            out += [(f.name, attr, s) for _, attr, s in declared_fields(f.metadata["group"])]
        elif "setting" in f.metadata:
            out.append((None, f.name, Setting(f.metadata.get("keyword") or prefix + f.name, **f.metadata["setting"])))
    return tuple(out)


def field_settings(cls: type) -> tuple[Setting, ...]:
    """The :class:`Setting` of every field of dataclass ``cls`` made with :func:`setting_field`, in field order, its
    settings groups' by their flat names (:func:`declared_fields`)."""
    return tuple(s for _, _, s in declared_fields(cls))


def field_setting(cls: type, name: str) -> Setting:
    """The :class:`Setting` of field ``name`` of dataclass ``cls`` (for a check its declaration cannot express)."""
    return next(s for s in field_settings(cls) if s.name == name)


def check_fields(obj: Any) -> None:
    """Validate every :func:`setting_field` of a dataclass instance in place (canonical values written back), its
    settings groups' too (frozen, they checked themselves when made; checked again, as a run checks its config)."""
    for group, attr, s in declared_fields(type(obj)):
        owner = getattr(obj, group) if group else obj
        object.__setattr__(owner, attr, s.check(getattr(owner, attr)))


def setting_value(obj: Any, name: str) -> Any:
    """The value of the setting with flat name ``name`` of dataclass instance ``obj`` (in a group or its own)."""
    for group, attr, s in declared_fields(type(obj)):
        if s.name == name:
            return getattr(getattr(obj, group) if group else obj, attr)
    raise AttributeError(f"{type(obj).__name__} has no setting {name!r}")


def flat_values(obj: Any) -> dict[str, Any]:
    """Every field of dataclass instance ``obj`` by its flat name, in field order: its settings groups' settings in
    the group's place (``lora_rank``, ...), a nested dataclass that is not a group as a dict (as
    :func:`dataclasses.asdict` gives it), so the record of a config with groups reads as it did without them."""
    out: dict[str, Any] = {}
    settings = {(group, attr): s.name for group, attr, s in declared_fields(type(obj))}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if "group" in f.metadata:
            out.update({settings[(f.name, g.name)]: getattr(value, g.name) for g in dataclasses.fields(value)
                        if (f.name, g.name) in settings})
        else:
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else copy.deepcopy(value)
    return out


def grouped_init(obj: Any, values: dict[str, Any]) -> None:
    """Fill dataclass instance ``obj`` (a class with settings groups and ``init=False``) from keywords: its own fields
    and whole groups by field name, else their defaults; a group's settings by their flat names (``lora_rank=4``),
    which win over a whole group given beside them (as :func:`dataclasses.replace` passes it). A name it has not is
    a ``TypeError``, as a dataclass's own ``__init__`` raises."""
    values = dict(values)
    fields = dataclasses.fields(obj)
    for f in fields:
        if f.name in values:
            value = values.pop(f.name)
        else:
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        object.__setattr__(obj, f.name, value)
    flat = {s.name: (group, attr) for group, attr, s in declared_fields(type(obj)) if group is not None}
    unknown = sorted(set(values) - set(flat))
    if unknown:
        raise TypeError(f"{type(obj).__name__}.__init__() got an unexpected keyword argument {unknown[0]!r}")
    changes: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        group, attr = flat[name]
        changes.setdefault(group, {})[attr] = value
    for group, given in changes.items():  # the group checks the values it is made with
        object.__setattr__(obj, group, dataclasses.replace(getattr(obj, group), **given))


def settings_object(cls: type, values: Any, command: str) -> Any:
    """A command's settings dataclass ``cls`` from an instance (checked), a mapping of its fields, or None (its
    defaults); a name it does not have is one line naming ``command`` and the names it has."""
    if isinstance(values, cls):
        check_fields(values)
        return values
    values = dict(values or {})
    refuse_unknown(cls, values, command)
    return cls(**values)  # every value checked by its declaration


def refuse_unknown(cls: type, values: Mapping[str, Any], command: str) -> None:
    """One line naming ``command``, each name ``values`` has that the dataclass ``cls`` has not (with the closest
    one it has), and the names it has."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise BertologyError(f"{command} has no setting {each_with_suggestion(unknown, known)}; "
                             f"its settings are: {', '.join(sorted(known))}.")


def compose(groups: Iterable[tuple[str, Iterable[Setting]]]) -> dict[str, Setting]:
    """Settings of several owners (``(owner, settings)`` pairs) in one ``name -> Setting`` map.

    Two owners may share a setting only by declaring the same record (a shared module constant);
    two different declarations under one name are a bug, refused here.
    """
    out: dict[str, Setting] = {}
    owners: dict[str, str] = {}
    for owner, settings in groups:
        for s in settings:
            if s.name in out and out[s.name] != s:
                raise ValueError(f"setting {s.name!r} is declared differently by {owners[s.name]} and {owner}")
            out.setdefault(s.name, s)
            owners.setdefault(s.name, owner)
    return out


def by_flag(declared: Mapping[str, Setting], given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` with a setting named by its flag's spelling (``lr`` for ``--lr``, ``importance`` for
    ``--importance``) renamed to the setting's own name, so Python takes both spellings the user may know."""
    alias = {s.flag_name: name for name, s in declared.items()}
    out: dict[str, Any] = {}
    for key, value in given.items():
        name = key if key in declared else alias.get(key, key)
        if name in out:
            raise BertologyError(f"Setting {name} given twice (as {name} and as {key}).")
        out[name] = value
    return out


def complete(declared: Mapping[str, Setting], given: Mapping[str, Any], *, where: str = "",
             also: Iterable[str] = ()) -> dict[str, Any]:
    """Every declared setting's value: the checked given value (by its name or its flag's spelling), else the
    default; unknown names refused (``also``: the names the caller takes besides these, e.g. the run's own fields,
    suggested and listed with them)."""
    given = by_flag(declared, given)
    unknown = sorted(set(given) - set(declared))
    if unknown:
        also = sorted(set(also))
        spellings = [*declared, *(s.flag_name for s in declared.values()), *also]  # a suggestion is an accepted name
        named = each_with_suggestion(unknown, spellings)
        raise BertologyError(f"Unknown setting{'s' if len(unknown) > 1 else ''} {named}"
                             f"{' for ' + where if where else ''}; known: {', '.join(sorted({*declared, *also}))}.")
    return {name: s.check(given[name]) if name in given else s.default for name, s in declared.items()}


def describe(declared: Mapping[str, Setting], values: Mapping[str, Any], owners: Mapping[str, str]) -> dict:
    """The manifest's ``settings`` section: per owner (an analysis, an experiment, the run), each setting's record."""
    out: dict[str, dict] = {}
    for name, s in declared.items():
        out.setdefault(owners.get(name, "run"), {})[name] = s.describe(values.get(name, s.default))
    return out


def describe_fields(groups: Iterable[tuple[str, Any]]) -> dict:
    """The manifest's ``settings`` section for a command whose settings are dataclass fields: per ``(owner, obj)``
    (``obj`` a dataclass instance), every :func:`setting_field` of ``obj`` with its value."""
    out: dict[str, dict] = {}
    for owner, obj in groups:
        declared = {s.name: s for s in field_settings(type(obj))}
        out.update(describe(declared, {n: setting_value(obj, n) for n in declared}, dict.fromkeys(declared, owner)))
    return out


# --------------------------------------------------------------------------------------------------
# Parsers shared by several declarations (command-line text -> value)
# --------------------------------------------------------------------------------------------------


def comma_list(text: str) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")``."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def count_or_indices(text: str) -> int | tuple[int, ...]:
    """``"20"`` -> 20 (a count); ``"0,4,9"`` -> (0, 4, 9) (indices)."""
    try:
        if "," not in text:
            return int(text)
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError("takes a count (e.g. 20) or a comma list of example indices (e.g. 0,4,9)") from None
