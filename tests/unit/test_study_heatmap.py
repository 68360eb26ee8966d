"""The study report's attention-change heatmap: its colours run from 0 to the figure's largest change, one scale for
every task, and the colour bar's ticks say the range (a fixed 0-0.05 scale drew 1e-4 and 2e-4 in one pale colour)."""
import numpy as np
import pandas as pd
import pytest

from bertology.viz.study import heatmap_top, task_layer_heatmap


def _effects(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([{"task": task, "layer": layer + 1, "change_mean": v, "beyond_noise": True}
                         for task, row in values.items() for layer, v in enumerate(row)])


def _mesh(fig):
    ax = fig.axes[0]
    return ax.collections[0], fig.axes[1]


def test_colours_span_the_data_shared_by_every_task():
    effects = _effects({"sst2": [1e-4, 2e-4, 4e-4], "stsb": [5e-5, 1e-4, 2e-4]})
    fig = task_layer_heatmap(effects, colorbar_label="1 - cosine")
    mesh, cbar_ax = _mesh(fig)
    assert mesh.norm.vmin == 0.0 and mesh.norm.vmax == pytest.approx(4e-4) == heatmap_top(effects)
    colours = mesh.cmap(mesh.norm(np.array([1e-4, 2e-4, 4e-4])))
    assert not np.allclose(colours[0], colours[1]) and not np.allclose(colours[1], colours[2])
    # the same value is the same colour in both tasks' rows: one scale for the figure
    fig.canvas.draw()
    faces = mesh.get_facecolors().reshape(2, 3, 4)  # rows are tasks in sorted order: sst2, stsb
    np.testing.assert_allclose(faces[0, 0], faces[1, 1])
    ticks = [t.get_text() for t in cbar_ax.get_yticklabels()]
    assert ticks == ["0", "0.0002", "0.0004"]  # the range, end to end


def test_an_unchanged_model_keeps_a_scale():
    effects = _effects({"a": [0.0, 0.0]})
    assert heatmap_top(effects) == 1.0
    mesh, _ = _mesh(task_layer_heatmap(effects))
    assert mesh.norm.vmax == 1.0
