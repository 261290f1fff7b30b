"""A picture of a measurement: the picture's and the sound's envelopes over time, before and after the offset.

Drawn with matplotlib's Agg canvas directly (no pyplot, no global backend change); matplotlib is
imported only when a plot is drawn.
"""

from __future__ import annotations

import numpy as np

from h3director.av.envelopes import GRID_S
from h3director.av.measure import AVSyncResult
from h3director.errors import H3DirectorError, missing_package


def envelope_rgb(result: AVSyncResult, width_px: int = 960, height_px: int = 480) -> np.ndarray:
    """The result's envelopes as a uint8 RGB array ``[height_px, width_px, 3]``. Top: as in the file;
    bottom: the sound moved by ``-offset_ms`` (how it lines up once corrected). Envelopes are the prepared
    ones the correlation saw (zero mean, unit variance); the title gives offset and confidence. Needs
    matplotlib (the `plot` extra): `H3DirectorError` naming the install command without it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - matplotlib is a declared dependency of the "plot" extra
        raise H3DirectorError(missing_package("plotting", "matplotlib", "plot")) from exc
    dpi = 100
    figure = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True)
    picture = result.picture if result.picture is not None else np.zeros(0)
    sound = result.sound if result.sound is not None else np.zeros(0)
    times = result.grid_start_s + np.arange(max(len(picture), len(sound))) * GRID_S
    if result.offset_ms is None:
        title = result.reason
    else:
        title = (f"offset {result.offset_ms:+.1f} ms ({'audio late' if result.offset_ms >= 0 else 'audio early'}), "
                 f"confidence {result.confidence:.2f}")
    figure.suptitle(title, fontsize=10)
    for axes, shift_s, label in ((top, 0.0, "as in the file"),
                                 (bottom, (result.offset_ms or 0.0) / 1000.0, "sound moved by -offset")):
        if len(picture):
            axes.plot(times[:len(picture)], picture, color="tab:blue", linewidth=0.8, label="picture motion")
        if len(sound):
            axes.plot(times[:len(sound)] - shift_s, sound, color="tab:orange", linewidth=0.8, alpha=0.8,
                      label="sound flux")
        axes.set_ylabel(label, fontsize=8)
        axes.tick_params(labelsize=7)
    if top.lines:
        top.legend(loc="upper right", fontsize=7)
    bottom.set_xlabel("time (s)", fontsize=8)
    figure.tight_layout()
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


__all__ = ["envelope_rgb"]
