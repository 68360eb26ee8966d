"""``STUDY.toml``: one base, many tasks x seeds, one comparison corpus — read and checked before any work.

The schema (every table refuses keys it does not know, naming them and the keys it allows)::

    base = "minilm"                # the pretrained encoder every model is compared with
    seeds = [0, 1, 2]              # fine-tuning seeds (a task may set its own)
    out = "study-out"              # optional; ``--out`` overrides; relative to the spec's folder
    device = "cpu"                 # optional: cpu, cuda, cuda:N, mps, auto

    [lab]                          # fine-tuning settings shared by every task (bertology finetune's options)
    epochs = 1                     # also: batch_size, lr, weight_decay, warmup_ratio, max_examples,
                                   #       max_length, eval_fraction, grad_accum, dtype, save_every (checkpoints: a killed fine-tune resumes),
                                   #       and any setting `bertology finetune --help` lists, by its name (learning_rate is lr):
                                   #       freeze_layers = 6, objective = "contrastive" (not seed, device, task or the
                                   #       columns: the study sets those; not drop_layers: a model with fewer layers
                                   #       cannot be compared with its base); checked when the spec is read

    [[task]]
    name = "sst2"                  # unique; letters, digits, '_', '-', '.'
    type = "classification"        # auto, classification, regression, tagging, qa or parsing
    data = "train.tsv"             # training data (any format finetune reads)
    eval_data = "dev.tsv"          # optional held-out data
    text_column = "sentence"       # optional columns: text_column, pair_column, label_column
    seeds = [0, 1]                 # optional: this task's seeds instead of the top-level ones
    # or, instead of data: existing fine-tunes by seed (no training)
    # models = { 0 = "path/to/seed0", 1 = "path/to/seed1" }

    [compare]
    data = "shared.tsv"            # the comparison corpus shared by every task (required)
    ood_data = "other.txt"         # optional out-of-domain corpus (RSA/CKA on it too; Merchant et al. 2020)
    analyses = ["attention_change", "representation_similarity"]
    # also: text_column, pair_column, label_column, ood_text_column, max_examples (500), max_length (128),
    #       batch_size (32), seed (0), report (true: each pair's report.html; false: tables only),
    #       and any setting `bertology compare --help` lists, by its name: rsa_tokens = 500, ablation_mode = "zero"
    own_data = true                # also compare each task's models on the task's own eval_data (Merchant et al.
                                   # 2020): STUDY/compare_own/<task>/, tables own_<table>; false: the shared corpus only
    own_seed_noise = true          # with own_data: also each task's seeds against each other on that eval_data
                                   # (STUDY/seeds_own/, tables own_seedpair_<table>; k-1 more jobs per task)

Relative paths resolve against the spec file's folder. :func:`load_spec` checks the schema and that
every file exists; :func:`check_models` loads the given fine-tunes and checks them against the base
(layers, heads, tokenizer); :func:`bertology.studies.checks.check_study` makes every other check the jobs would
make that needs no training — all before any job runs.
"""
from __future__ import annotations

import os

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from bertology.errors import BertologyError, each_with_suggestion, safe_name

TOP_KEYS = ("base", "seeds", "out", "device", "lab", "task", "compare")
#: ``[lab]``'s short names (kept from before every fine-tuning setting could be given by its own name) -> the
#: FinetuneConfig field (``max_examples``/``max_length`` go to its DataConfig). Any other setting ``bertology
#: finetune`` declares is a [lab] key by its field name, except those the study decides itself (:data:`LAB_DECIDED`).
LAB_KEYS = {
    "epochs": "epochs", "batch_size": "batch_size", "lr": "learning_rate", "weight_decay": "weight_decay",
    "warmup_ratio": "warmup_ratio", "max_examples": "max_examples", "max_length": "max_length",
    "eval_fraction": "eval_fraction", "grad_accum": "grad_accum", "dtype": "dtype", "save_every": "save_every",
}
#: Fine-tuning settings a study sets itself: the seeds, the device, each [[task]]'s type and columns.
LAB_DECIDED = ("seed", "device", "task", "text_column", "pair_column", "label_column")
#: Fine-tuning settings a study cannot take yet: tracking while training needs a tracker its fine-tune jobs do not
#: start, so these are refused when the spec is read rather than failing every fine-tune job.
LAB_REFUSED = ("track_every", "track_analyses", "track_examples")
#: Fine-tuning settings a study can never take, with why (refused when the spec is read).
LAB_NEVER = {
    "drop_layers": "a study compares every fine-tune with its base, which needs the same architecture, and a model "
                   "with layers removed has fewer; fine-tune with bertology finetune --drop-layers and compare it "
                   "with bertology compare instead",
}
TASK_KEYS = ("name", "type", "data", "eval_data", "text_column", "pair_column", "label_column", "seeds", "models",
             "method")
#: How a [[task]] may fine-tune (``method``; default: [lab]'s, else full): LoRA vs full on one study's seeds.
METHODS = ("full", "lora")
COMPARE_KEYS = ("data", "text_column", "pair_column", "label_column", "ood_data", "ood_text_column", "analyses",
                "max_examples", "max_length", "batch_size", "seed", "report", "own_data", "own_seed_noise")
TASK_TYPES = ("auto", "classification", "regression", "tagging", "qa", "parsing")
DEFAULT_ANALYSES = ("attention_change", "representation_similarity")
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class TaskSpec:
    """One task of a study: data to fine-tune on (per seed), or existing fine-tunes by seed."""

    name: str
    type: str = "auto"
    data: str | None = None
    eval_data: str | None = None
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    seeds: tuple[int, ...] = ()
    models: dict[int, str] = field(default_factory=dict)  # seed -> existing fine-tuned model
    method: str | None = None  # full or lora for this task's fine-tunes (None: [lab]'s method)

    def lab(self, lab: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The fine-tuning settings of this task's jobs: [lab]'s, with this task's ``method`` when it gives one."""
        return tuple(sorted({**lab, **({"method": self.method} if self.method else {})}.items()))

    @property
    def columns(self) -> dict[str, str | None]:
        return {"text_column": self.text_column, "pair_column": self.pair_column, "label_column": self.label_column}


@dataclass(frozen=True)
class CompareSpec:
    """The comparison every model goes through: one shared corpus (and an optional out-of-domain one)."""

    data: str
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    ood_data: str | None = None
    ood_text_column: str | None = None
    analyses: tuple[str, ...] = DEFAULT_ANALYSES
    max_examples: int | None = 500
    max_length: int = 128
    batch_size: int = 32
    seed: int = 0
    report: bool = True  # each pair's report.html (false: tables only, faster)
    own_data: bool = True  # also compare each task with eval_data on that eval_data (compare_own/<task>/)
    own_seed_noise: bool = True  # with own_data: the task's seeds against each other on that eval_data (seeds_own/)
    #: any other setting ``bertology compare`` declares (``rsa_tokens = 500``, ``ablation_mode = "zero"``), checked
    #: by its declaration when the spec is read (repr=False: specs without any keep their fingerprints)
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def on_own_data(self, task: TaskSpec) -> CompareSpec:
        """These settings on ``task``'s eval data, read with the task's text/pair columns (no out-of-domain part)."""
        from dataclasses import replace

        return replace(self, data=task.eval_data, text_column=task.text_column, pair_column=task.pair_column,
                       label_column=None, ood_data=None, ood_text_column=None)


@dataclass(frozen=True)
class StudySpec:
    """A whole study, paths resolved: what :func:`bertology.studies.runner.run_study` runs."""

    path: Path | None  # the spec file (None: a dict spec, kept as ``text``)
    base: str
    tasks: tuple[TaskSpec, ...]
    compare: CompareSpec
    lab: dict[str, Any] = field(default_factory=dict)
    out: Path | None = None
    device: str = "cpu"
    text: str | None = None  # a dict spec's TOML, written as the study's study.toml


def _check_keys(table: dict, allowed, where: str) -> None:
    unknown = [k for k in table if k not in allowed]
    if unknown:
        named = each_with_suggestion(unknown, allowed, quoted=True)
        raise BertologyError(f"Unknown key{'s' if len(unknown) > 1 else ''} {named} in {where}; "
                             f"allowed: {', '.join(allowed)}.")


def _typed(value, types, key: str, where: str, what: str):
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise BertologyError(f"{where}: {key} must be {what}, not {value!r}.")
    return value


def _seeds(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise BertologyError(f"{where}: seeds must be a non-empty list of integers, not {value!r}.")
    if len(set(value)) != len(value):
        raise BertologyError(f"{where}: seeds {value} repeat a seed; each seed once.")
    return tuple(value)


def _file(value, key: str, where: str, root: Path, required: bool = False) -> str | None:
    """A data or model path resolved against the spec's folder; hub-style ``hf:`` data is left as it is."""
    if value is None:
        if required:
            raise BertologyError(f"{where}: {key} is required.")
        return None
    _typed(value, str, key, where, "a path (string)")
    if value.startswith("hf:"):
        return value
    path = (root / value).expanduser()
    if not path.exists():
        raise BertologyError(f"{where}: {key} {value!r} does not exist ({path}).")
    return str(path)


def _model(value: str, root: Path) -> str:
    """A model name: a local path when it exists relative to the spec, else a hub id or built-in name as given."""
    candidate = (root / value).expanduser()
    return str(candidate) if candidate.exists() else value


def _task(raw: dict, i: int, top_seeds: tuple[int, ...] | None, root: Path) -> TaskSpec:
    where = f"[[task]] #{i + 1}" + (f" ({raw['name']!r})" if isinstance(raw.get("name"), str) else "")
    _check_keys(raw, TASK_KEYS, where)
    name = _typed(raw.get("name"), str, "name", where, "a string")
    try:
        safe_name("task name", name)  # it names folders: finetune/<task>/, compare_own/<task>/, seeds/<task>/
    except BertologyError as err:
        raise BertologyError(f"{where}: {err}") from None
    if not NAME.match(name):
        raise BertologyError(f"{where}: name {name!r} may hold only letters, digits, '_', '-' and '.'.")
    kind = raw.get("type", "auto")
    if kind not in TASK_TYPES:
        raise BertologyError(f"{where}: type must be one of {', '.join(TASK_TYPES)}, not {kind!r}.")
    columns = {k: _typed(raw[k], str, k, where, "a column name") for k in ("text_column", "pair_column", "label_column") if k in raw}
    if "models" in raw:
        if "data" in raw or "eval_data" in raw:
            raise BertologyError(f"{where}: give either data (to fine-tune) or models (existing fine-tunes), not both.")
        models = raw["models"]
        if not isinstance(models, dict) or not models:
            raise BertologyError(f"{where}: models must be a table of seed = path, e.g. models = {{ 0 = \"run/model\" }}.")
        parsed: dict[int, str] = {}
        for seed, path in models.items():
            try:
                s = int(seed)
            except ValueError:
                raise BertologyError(f"{where}: models keys are seeds (integers), not {seed!r}.") from None
            parsed[s] = _model(_typed(path, str, f"models.{seed}", where, "a path"), root)
            local = Path(parsed[s])
            if not local.exists() and ("/" in path or path.startswith(".")):
                raise BertologyError(f"{where}: models.{seed} {path!r} does not exist ({local}).")
        if "seeds" in raw and sorted(_seeds(raw["seeds"], where)) != sorted(parsed):
            raise BertologyError(f"{where}: seeds {raw['seeds']} differ from the seeds of models {sorted(parsed)}.")
        return TaskSpec(name, kind, seeds=tuple(sorted(parsed)), models=parsed, **columns)
    method = raw.get("method")
    if method is not None and method not in METHODS:
        raise BertologyError(f"{where}: method must be one of {', '.join(METHODS)}, not {method!r}.")
    seeds = _seeds(raw["seeds"], where) if "seeds" in raw else top_seeds
    if seeds is None:
        raise BertologyError(f"{where}: no seeds: set seeds = [...] at the top of the spec or in the task.")
    return TaskSpec(name, kind, data=_file(raw.get("data"), "data", where, root, required=True),
                    eval_data=_file(raw.get("eval_data"), "eval_data", where, root), seeds=seeds, method=method,
                    **columns)


def _compare(raw, root: Path) -> CompareSpec:
    where = "[compare]"
    if not isinstance(raw, dict):
        raise BertologyError("The spec needs a [compare] table with data = the comparison corpus.")
    declared = _compare_settings()
    _check_keys(raw, (*COMPARE_KEYS, *sorted(set(declared) - set(COMPARE_KEYS))), where)
    try:
        extra = {k: declared[k].check(v) for k, v in raw.items() if k not in COMPARE_KEYS}
    except BertologyError as err:
        raise BertologyError(f"{where}: {err}") from None
    kw: dict[str, Any] = {k: _typed(raw[k], str, k, where, "a column name")
                          for k in ("text_column", "pair_column", "label_column", "ood_text_column") if k in raw}
    numbers = _compare_numbers()
    for k in ("max_examples", "max_length", "batch_size", "seed"):
        if k in raw:
            kw[k] = _typed(raw[k], int, k, where, "an integer")
            try:  # by the declaration a comparison job checks it with (kept as given: 0 examples is "all")
                numbers[k].check(kw[k])
            except BertologyError as err:
                raise BertologyError(f"{where}: {err}") from None
    for k in ("report", "own_data", "own_seed_noise"):
        if k in raw:
            kw[k] = _typed(raw[k], bool, k, where, "true or false")
    if "analyses" in raw:
        analyses = raw["analyses"]
        if isinstance(analyses, str):
            analyses = [analyses]
        if not isinstance(analyses, list) or not all(isinstance(a, str) for a in analyses):
            raise BertologyError(f"{where}: analyses must be a list of names, not {analyses!r}.")
        from bertology.commands.selection import select

        select(analyses)  # unknown names: one error naming the known ones
        kw["analyses"] = tuple(analyses)
    return CompareSpec(data=_file(raw.get("data"), "data", where, root, required=True),
                       ood_data=_file(raw.get("ood_data"), "ood_data", where, root), settings=extra, **kw)


def _compare_numbers() -> dict:
    """The declarations of [compare]'s own numbers (``max_examples``, ``max_length``: the corpus's; ``batch_size``,
    ``seed``: the run's), as ``bertology compare`` declares them."""
    from bertology.config import CompareConfig, DataConfig
    from bertology.settings import field_settings

    return {s.name: s for s in (*field_settings(DataConfig), *field_settings(CompareConfig))
            if s.name in ("max_examples", "max_length", "batch_size", "seed")}


def _compare_settings() -> dict:
    """Every setting ``bertology compare`` declares that a study may set in [compare] (not those a study decides
    itself: the models, the output, the device)."""
    from bertology.config import CompareConfig
    from bertology.commands.selection import declared_settings
    from bertology.settings import field_settings

    own = {s.name: s for s in field_settings(CompareConfig) if s.name not in ("base", "device", "store")}
    return {**own, **declared_settings()[0]}


def lab_settings() -> dict[str, Any]:
    """``[lab]`` key -> the declaration of the fine-tuning setting it sets: the short names of :data:`LAB_KEYS`
    first, then every other declared setting by its field name (not those of :data:`LAB_DECIDED`)."""
    from bertology.config import FINETUNE_DATA_SETTINGS, FinetuneConfig
    from bertology.settings import field_settings

    declared = {s.name: s for s in (*field_settings(FinetuneConfig), *FINETUNE_DATA_SETTINGS)
                if s.name not in (*LAB_DECIDED, *LAB_REFUSED, *LAB_NEVER)}
    short = {key: declared[name] for key, name in LAB_KEYS.items()}
    return {**short, **{name: s for name, s in declared.items() if name not in short}}


def lab_config(lab: Mapping[str, Any], **run: Any):
    """The FinetuneConfig a study's ``[lab]`` values (keys as :func:`lab_settings` names them) make with ``run``'s
    (model, data path and columns, out, eval data, seed, device, task); the lab's data settings go to its DataConfig."""
    from bertology.config import FINETUNE_DATA_SETTINGS, DataConfig, FinetuneConfig

    fields = {LAB_KEYS.get(k, k): v for k, v in lab.items()}
    data_names = {s.name for s in FINETUNE_DATA_SETTINGS}
    data = DataConfig(path=run.pop("data", ""), overlong="truncate", max_examples=fields.pop("max_examples", None),
                      **run.pop("columns", {}), **{k: fields.pop(k) for k in list(fields) if k in data_names})
    return FinetuneConfig(data=data, **run, **fields)


def _lab(raw, root: Path) -> dict[str, Any]:
    """``[lab]`` checked by the settings' declarations (and every bound a fine-tuning run checks), before any job runs.

    Values are kept as given (a list as a tuple), under the key given, so the job fingerprints of specs written
    before every setting was a [lab] key do not change; a setting's field name and its short name are one key.
    """
    declared = lab_settings()
    if not isinstance(raw, dict):
        raise BertologyError(f"[lab] must be a table of fine-tuning settings ({', '.join(declared)}).")
    refused = [k for k in raw if k in LAB_REFUSED]
    if refused:
        raise BertologyError(f"[lab]: {', '.join(refused)}: a study cannot track while training yet; track a study's "
                             "fine-tune afterwards (save_every = N, then bertology track on its finetune/ folder).")
    never = [k for k in raw if k in LAB_NEVER]
    if never:
        raise BertologyError(f"[lab]: {never[0]} cannot be a study setting: {LAB_NEVER[never[0]]}.")
    _check_keys(raw, tuple(declared), "[lab]")
    short = {name: key for key, name in LAB_KEYS.items() if key != name}  # learning_rate -> lr
    lab: dict[str, Any] = {}
    for key, value in raw.items():
        key = short.get(key, key)
        if key in lab:
            raise BertologyError(f"[lab]: {key} is given twice ({key} and {LAB_KEYS[key]} are one setting).")
        lab[key] = _file(value, key, "[lab]", root, required=True) if key == "sts_data" else value
    try:
        lab_config(lab)  # every bound a run checks, with the run's own messages: --flag (name) must be ...
        return {key: declared[key].check(value) for key, value in lab.items()}
    except BertologyError as err:
        raise BertologyError(f"[lab]: {err}") from None


def load_spec(spec: str | Path | Mapping[str, Any]) -> StudySpec:
    """Read and check a study spec (schema, names, seeds, files); one clear error for the first problem.

    ``spec`` is ``STUDY.toml``, or the same tables as a dict (a notebook's spec: ``{"base": "minilm", "seeds":
    [0, 1], "task": [{"name": "sst2", "data": "train.tsv"}], ...}``; its relative paths from the working
    directory; model seeds may be ints). A dict must be what TOML can hold; it is kept as the study's
    ``study.toml``."""
    if isinstance(spec, Mapping):
        text = spec_toml(spec)
        return _spec(tomllib.loads(text), Path.cwd().resolve(), "the study spec (a dict)", None, text)
    if not isinstance(spec, (str, os.PathLike)):
        raise BertologyError(f"A study spec is the path of a STUDY.toml or a dict of its tables, not "
                             f"{type(spec).__name__} {str(spec)[:60]!r}.")
    path = Path(spec).expanduser()
    if not path.is_file():
        raise BertologyError(f"Study spec {path} does not exist.")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise BertologyError(f"{path} is not valid TOML: {err}") from None
    return _spec(raw, path.parent.resolve(), path.name, path.resolve(), None)


def spec_toml(spec: Mapping[str, Any]) -> str:
    """A dict spec as the TOML it stands for (keys as strings, paths as text); one clear error for a value TOML
    cannot hold (a DataFrame: a study's jobs read their data from files)."""
    import tomli_w

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return str(value) if isinstance(value, Path) else value

    try:
        return tomli_w.dumps(plain(spec))
    except TypeError as err:
        raise BertologyError(f"The study spec (a dict) holds what TOML cannot ({err}); give files by path: a study's "
                             "jobs read their data from files.") from None


def _spec(raw: dict, root: Path, name: str, path: Path | None, text: str | None) -> StudySpec:
    """The StudySpec of a parsed spec whose relative paths start at ``root`` (``name``: what errors call it)."""
    _check_keys(raw, TOP_KEYS, f"the top level of {name}")
    base = _model(_typed(raw.get("base", "minilm"), str, "base", name, "a model name or path"), root)
    top_seeds = _seeds(raw["seeds"], name) if "seeds" in raw else None
    tasks_raw = raw.get("task")
    if not isinstance(tasks_raw, list) or not tasks_raw:
        raise BertologyError(f"{name} has no [[task]] tables; add at least one.")
    tasks = tuple(_task(t, i, top_seeds, root) for i, t in enumerate(tasks_raw))
    names = [t.name for t in tasks]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BertologyError(f"Two tasks are called {', '.join(map(repr, repeated))}; task names must be unique "
                             "(they name the tuned models: <task>/s<seed>).")
    out = raw.get("out")
    device = _typed(raw.get("device", "cpu"), str, "device", name, "a string")
    return StudySpec(path=path, base=base, tasks=tasks, compare=_compare(raw.get("compare"), root),
                     lab=_lab(raw.get("lab", {}), root), out=(root / _typed(out, str, "out", name, "a path")) if out else None,
                     device=device, text=text)


def check_models(spec: StudySpec, base: Any = None) -> None:
    """Load the base (unless ``base``, loaded already, is given) and every given fine-tune; one clear error for a
    model of another shape or tokenizer."""
    given = [(t, s, p) for t in spec.tasks for s, p in sorted(t.models.items())]
    if not given:
        return
    from bertology.models.loading import load_model
    from bertology.models.pair import check_compatible

    base = base if base is not None else load_model(spec.base)
    for task, seed, path in given:
        try:
            check_compatible(base, load_model(path, adapter_base=spec.base))
        except BertologyError as err:
            raise BertologyError(f"task {task.name!r}, seed {seed}: {err}") from None
