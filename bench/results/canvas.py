"""What every PNG of the suite shares: matplotlib's Agg canvas without pyplot state, the arms'
order and colours, a panel grid, a note drawn where data is missing, cell labels that wrap,
and the atomic write of a figure."""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Iterable
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.arms import BASELINE
from bench.fileio import atomic_write_bytes

ARM_COLORS = {"baseline": "tab:blue", "liger": "tab:orange"}
NO_VRAM_NOTE = "no VRAM data (CPU run / poller unavailable)"
LABEL_BOX = {"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85}


def save(fig: Figure, path: str | Path, dpi: int = 90) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def arms_in_order(values: Iterable) -> list[str]:
    """Arms in display order: baseline first, then the rest alphabetically."""
    return sorted({str(a) for a in values if isinstance(a, str)}, key=lambda a: (a != BASELINE, a))


def color(arm: str, arms: list[str]) -> str:
    return ARM_COLORS.get(arm, f"C{2 + arms.index(arm) % 8}" if arm in arms else "0.5")


def note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="0.3")
    ax.set_xticks([])
    ax.set_yticks([])


def grid(
    n: int, title: str, width: float = 5.2, height: float = 3.8, ncols: int = 3
) -> tuple[Figure, list[Axes]]:
    """A figure with one panel per cell (at most ``ncols`` across); unused panels hidden."""
    ncols = max(1, min(n, ncols))
    nrows = max(1, math.ceil(n / ncols))
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes


def wrap(label: str, width: int = 26) -> str:
    """A tick or panel label broken at spaces (never inside a name) into lines of about ``width``."""
    return (
        "\n".join(textwrap.wrap(label, width=width, break_on_hyphens=False, break_long_words=False)) or label
    )
