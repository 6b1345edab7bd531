"""Which arms fail parity, for every verdict a user acts on: an arm (not the floor arms aa and
aa_eps, the yardsticks, which are meant to drift) fails when its loss parity
failed (summary.csv's ``loss_parity``: "FAIL in k of n pairs ...", bench/results/parity.py) or a
metric of its training parity is not equivalent to the baseline against the A/A floor
(training_parity.csv's ``verdict``, bench/results/training_parity.py). A faster arm that
computes something else is no gain: ``bench report`` and ``bench sweep`` exit PARITY_EXIT, the
PR Summary says so first, and ``bench compare`` fails its gates on such a row (docs/reference.md, "Exit
status")."""

from __future__ import annotations

import pandas as pd

from bench.arms import NOT_UNDER_TEST
from bench.results.verdicts import Parity, parity_kind

PARITY_EXIT = 4  # an arm failed loss or training parity (1: runs failed or the environment, 2: bad input)


def failures(summary: pd.DataFrame, training: pd.DataFrame | None = None) -> dict[tuple[str, str], str]:
    """(cell_id, arm) -> why its parity failed, in words; empty when every arm passed or had none."""
    out: dict[tuple[str, str], list[str]] = {}
    if "loss_parity" in summary:
        for r in summary.itertuples():
            verdict = r.loss_parity
            if str(r.arm) in NOT_UNDER_TEST:  # the yardsticks (aa, aa_eps, the negative controls)
                continue
            if parity_kind(verdict) is Parity.FAIL:
                out.setdefault((str(r.cell_id), str(r.arm)), []).append(f"loss parity {verdict}")
    if training is not None and len(training) and "verdict" in training:
        for (cell, arm), g in training.groupby(["cell_id", "arm"], sort=False):
            if str(arm) in NOT_UNDER_TEST:
                continue
            bad = [
                str(m) for m, v in zip(g["metric"], g["verdict"]) if parity_kind(v) is Parity.NOT_EQUIVALENT
            ]
            if bad:
                out.setdefault((str(cell), str(arm)), []).append(
                    f"training parity not equivalent on {', '.join(bad)}"
                )
    return {key: "; ".join(why) for key, why in out.items()}


def side_verdict(loss_parity, training: pd.DataFrame | None, cell_id, arm) -> str | None:
    """One arm's parity on one side of a comparison: "FAIL: ...", "pass", or None (no parity data)."""
    key = (str(cell_id), str(arm))
    row = pd.DataFrame([{"cell_id": cell_id, "arm": arm, "loss_parity": loss_parity}])
    why = failures(row, training).get(key)
    if why:
        return f"FAIL: {why}"
    judged = (
        training is not None
        and len(training) > 0
        and key in set(zip(training["cell_id"].astype(str), training["arm"].astype(str)))
    )
    if (isinstance(loss_parity, str) and loss_parity) or judged:
        return "pass"
    return None


def headline(found: dict[tuple[str, str], str]) -> str:
    """The one line that says which arms failed parity (for the PR Summary and the console)."""
    parts = [f"{arm} ({cell}): {why}" for (cell, arm), why in found.items()]
    return "Parity FAILED: " + "; ".join(parts) + ". Its Δ is not a like-for-like gain."
