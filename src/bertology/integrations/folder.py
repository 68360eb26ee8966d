"""The tracker's run folder: ``bertology track``'s tables and figures, in a folder of kind ``track``.

Written for :class:`~bertology.integrations.trainer.BertologyCallback` and ``bertology finetune --track-every``.

Tables are rewritten (atomically) at every event, so a run stopped half-way leaves what it measured;
the manifest says ``running`` until training ends, then ``complete`` with its figures listed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bertology.results import atomic_write_text, now_iso, write_table
from bertology.commands.base import hold
from bertology.runs import build_manifest, fingerprint
from bertology.settings import describe_fields

KIND = "track"


def table_name(name: str) -> str:
    """The file name of a tracked table (``track_<analysis>``, ``track_gradient_norms``): ``tables/<name>.parquet``."""
    return f"track_{name}"


class TrackWriter:
    """Holds the run folder (its lock) from the first event to the end of training."""

    def __init__(self, out: Path, tracker: Any, *, overwrite: bool = False):
        """``tracker``: the :class:`~bertology.integrations.tracker.Tracker` whose settings, probe corpus and
        analysis settings the folder records (and fingerprints)."""
        self.settings, self.corpus = tracker.settings, tracker.corpus
        self.analysis_settings = tracker.analysis_settings
        print_ = fingerprint(vars(self.settings), self.analysis_settings, self.corpus.fingerprint())
        self.opened = hold(out, KIND, print_, overwrite=overwrite, fresh=True)  # held until training ends
        self.fingerprint = print_
        self.source = getattr(tracker, "source", "BertologyCallback (transformers Trainer)")
        #: the tables an identical earlier run left in the folder (a resumed run reads them back)
        self.previous_tables = [str(t).removeprefix("track_") for t in self.opened.previous.get("tables") or []]
        self.written: set[str] = set()
        self._manifest("running")

    @property
    def path(self) -> Path:
        return self.opened.path

    def _manifest(self, status: str, figures: list[str] = ()) -> None:
        """Write the manifest: what was measured on which probe set, and the tables so far."""
        previous = self.opened.dir.read_manifest() or {}
        manifest = build_manifest(
            KIND, self.fingerprint, created=previous.get("created"), status=status, data=self.corpus.describe(),
            source=self.source,
            track={"analyses": list(self.settings.analyses), "settings": describe_fields([("callback", self.settings)]),
                   "analysis_settings": self.analysis_settings, "max_examples": self.settings.max_examples,
                   "max_length": self.settings.max_length, "figures": list(figures)},
            tables=sorted(table_name(n) for n in self.written))
        if status == "complete":
            manifest["finished"] = now_iso()
        self.opened.dir.write_manifest(manifest)

    def write(self, name: str, table: pd.DataFrame) -> None:
        """Rewrite ``tables/track_<name>`` (and list it in the manifest the first time)."""
        write_table(self.path, table_name(name), table)
        if name not in self.written:
            self.written.add(name)
            self._manifest("running")

    def finish(self, tables: dict[str, pd.DataFrame]) -> None:
        """Draw ``figures/track_<name>.svg`` (track's figures), mark the run complete, release the folder."""
        from bertology.viz.track import track_figures
        from bertology.viz.figures import figure_to_svg

        try:
            figures = []
            for name, fig in track_figures(tables).items():
                path = self.path / "figures" / f"{table_name(name)}.svg"
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, figure_to_svg(fig, id_prefix=f"track-{name}"))
                figures.append(str(path.relative_to(self.path)))
            self._manifest("complete", figures)
        finally:
            self.opened.close()
