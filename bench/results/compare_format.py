"""`bench compare`'s output: the console table (text), a Markdown PR comment (md) and JSON for a
bot, each with both sides' labels and versions (every version that differs between A and B
flagged), the compared rows, the rows not compared (different workloads, one side only), the
notes (runs that never ran, arms not in effect, how a sweep's own arm was paired) and the gates'
lines; and the files of ``--out`` (compare.csv, .md, .json, .png). Every "Δ [CI]" is printed
through ``ci_text``, which never prints a CI that does not hold its point."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pandas as pd

from bench import fmt
from bench.fileio import atomic_write_text
from bench.results.columns import DEFAULT_TRAINER
from bench.results.compare_inputs import SUMMARY_ONLY
from bench.results.gate import DIFFERENT, row_name
from bench.results.plots import plot_compare
from bench.results.report import write_csv
from bench.results.tables import join_unique

# (label, provenance column, whether a difference is flagged: the commit and host are what differs by design)
VERSION_FIELDS = [
    ("GPU", "gpu_name", True), ("driver", "driver_version", True), ("CUDA/ROCm", "cuda_version", True),
    ("torch", "torch_version", True), ("Triton", "triton_version", True),
    ("transformers", "transformers_version", True), ("liger-kernel", "liger_version", True),
    ("commit", "git_commit", False), ("host", "hostname", False),
]  # fmt: skip


def label(df: pd.DataFrame, path: Path) -> str:
    parts = [
        f"{c} {join_unique(df[c])}" for c in ("gpu_name", "git_commit") if c in df and join_unique(df[c])
    ]
    return f"{path}" + (f" ({'; '.join(parts)})" if parts else "")


def ci_text(point, lo, hi, spec: str = "+.1f", unit: str = "%") -> str:
    """``+1.2% [-0.3, +2.6]``; the point alone without a CI; "—" without a point. A CI that does
    not hold its point is never printed (it would be a bug or a damaged input)."""
    if fmt.isnan(point):
        return "—"
    text = f"{fmt.f(point, spec)}{unit}"
    if fmt.isnan(lo) or fmt.isnan(hi):
        return text
    slack = 1e-6 * max(1.0, abs(float(point)))
    if not float(lo) - slack <= float(point) <= float(hi) + slack:
        return f"{text} [CI withheld: it does not hold its estimate]"
    return f"{text} [{fmt.f(lo, spec)}, {fmt.f(hi, spec)}]"


def version_rows(sides: dict) -> list[tuple[str, str, str, bool]]:
    """(what, A's, B's, differs) for each version either side records."""
    rows = []
    for name, col, flagged in VERSION_FIELDS:
        va, vb = (", ".join(s.attrs["versions"].get(col) or []) for s, _ in sides.values())
        if va or vb:
            rows.append((name, va or "—", vb or "—", flagged and va != vb))
    return rows


def _differing(sides: dict) -> list[str]:
    return [name for name, _, _, differs in version_rows(sides) if differs]


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    both = df[df["present"] == "both"]
    num = lambda spec: lambda x: fmt.f(x, spec)  # noqa: E731
    shown = pd.DataFrame({
        "profile": both["profile"], "mode": both["mode"], "bs": both["batch_size"].map(num(".0f")),
        "seq": both["seq_len"].map(num(".0f")), "acc": both["accumulation_steps"].map(num(".0f")),
        "anchors": both["num_anchors"].map(num(".0f")), "gpus": both["gpus"].map(num(".0f")), "arm": both["arm"],
        "samples/s A": both["samples_per_s_a"].map(num(".2f")), "samples/s B": both["samples_per_s_b"].map(num(".2f")),
        "Δ% B vs A (95% CI)": [
            ci_text(p, lo, hi) + (" point estimate" if e != "per-run data (Welch)" and not fmt.isnan(p) else "")
            for p, lo, hi, e in zip(both["samples_per_s_delta_pct"], both["samples_per_s_delta_pct_ci95_low"],
                                    both["samples_per_s_delta_pct_ci95_high"], both["estimate"])
        ],
        "s/step A": both["s_per_step_a"].map(num(".3f")), "s/step B": both["s_per_step_b"].map(num(".3f")),
        "VRAM−idle A": both["vram_over_idle_gib_a"].map(num(".2f")),
        "VRAM−idle B": both["vram_over_idle_gib_b"].map(num(".2f")),
        "Δ VRAM−idle GiB": both["vram_over_idle_b_minus_a_gib"].map(num("+.2f")),
        "Δ gross GiB": both["peak_vram_b_minus_a_gib"].map(num("+.2f")),
        "gain A": [ci_text(p, lo, hi) for p, lo, hi in zip(both["delta_samples_per_s_pct_a"], both["delta_samples_per_s_pct_ci95_low_a"], both["delta_samples_per_s_pct_ci95_high_a"])],
        "gain B": [ci_text(p, lo, hi) for p, lo, hi in zip(both["delta_samples_per_s_pct_b"], both["delta_samples_per_s_pct_ci95_low_b"], both["delta_samples_per_s_pct_ci95_high_b"])],
        "gain B − A (points)": [ci_text(p, lo, hi, unit="") for p, lo, hi in zip(both["gain_change_points"], both["gain_change_points_ci95_low"], both["gain_change_points_ci95_high"])],
        "B vs A": both["verdict"].fillna("—"),
        "parity A": [_parity_word(v) for v in both.get("parity_a", pd.Series(None, index=both.index))],
        "parity B": [_parity_word(v) for v in both.get("parity_b", pd.Series(None, index=both.index))],
    })  # fmt: skip
    if (both["trainer"] != DEFAULT_TRAINER).any():
        shown.insert(0, "trainer", both["trainer"])
    if (pd.to_numeric(both["nodes"], errors="coerce").fillna(1) > 1).any():
        shown.insert(shown.columns.get_loc("arm"), "nodes", both["nodes"].map(num(".0f")))
    return shown


CONSOLE_WIDTH = 100  # the console table's width; compare.md and compare.csv hold every column


def _console_rows(df: pd.DataFrame) -> list[str]:
    """The console's table: per workload a heading, then per arm samples/s A and B, the Δ with its
    CI, the verdict, the change of the arm's gain and both sides' parity, within CONSOLE_WIDTH
    columns (s/step, VRAM and each side's gain are in compare.md / compare.csv: --out DIR)."""
    both = df[df["present"] == "both"]
    if not len(both):
        return ["(no workload is in both A and B)"]
    full = _rows(df)
    keys = [
        c for c in ("trainer", "profile", "mode", "bs", "seq", "acc", "anchors", "gpus", "nodes") if c in full
    ]
    names = {"bs": "bs", "seq": "s", "acc": "acc", "anchors": "anchors", "gpus": "gpus", "nodes": "nodes"}
    out: list[str] = []
    for key, group in full.groupby(keys, sort=False, dropna=False):
        parts = [f"{names[k]}{v}" if k in names else str(v) for k, v in zip(keys, key, strict=True)]
        out.append(f"{' '.join(parts)} (samples/s)")
        table = pd.DataFrame({
            "arm": group["arm"].astype(str).str.ljust(int(group["arm"].astype(str).str.len().max())),
            "A": group["samples/s A"], "B": group["samples/s B"],
            "Δ B vs A (95% CI)": group["Δ% B vs A (95% CI)"],
            "verdict": [str(v).split(":")[0] for v in group["B vs A"]],  # the word; the reason in the files
            "gain B−A (points)": group["gain B − A (points)"],
            "parity A/B": [f"{a}/{b}" for a, b in zip(group["parity A"], group["parity B"], strict=True)],
        })  # fmt: skip
        out += [f"  {ln}" for ln in table.to_string(index=False, justify="left").splitlines()]
    return [*out, "(s/step, VRAM and each side's gain: compare.md and compare.csv, written with --out DIR)"]


def _parity_word(verdict) -> str:
    """compare.csv's parity_a/parity_b in one word for the table: FAIL, pass or —."""
    return verdict.split(":")[0] if isinstance(verdict, str) and verdict else "—"


def _others(df: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """(heading, lines) for the rows not compared: different workloads, then each side's own."""
    out = []
    diff = df[df["present"] == DIFFERENT]
    if len(diff):
        out.append(
            (
                "Not compared: different workloads",
                [f"{row_name(r)}: {r.workloads_differ}" for r in diff.itertuples()],
            )
        )
    for which in ("A only", "B only"):
        rows = df[df["present"] == which]
        if len(rows):
            out.append((f"Only in {which[0]}", [row_name(r) for r in rows.itertuples()]))
    return out


def _sources(sides: dict) -> list[str]:
    return [f"{k}: {s.attrs['source']}" + (" — no CI and no gate verdict" if s.attrs["source"] == SUMMARY_ONLY else "")
            for k, (s, _) in sides.items()]  # fmt: skip


def render(df: pd.DataFrame, sides: dict, fmt_name: str, gate_result) -> str:
    if fmt_name == "json":
        return json.dumps(as_json(df, sides, gate_result), indent=2, sort_keys=False, allow_nan=False)
    if fmt_name == "md":
        return "\n".join(as_markdown(df, sides, gate_result))
    return "\n".join(as_text(df, sides, gate_result))


def as_text(df: pd.DataFrame, sides: dict, gate_result) -> list[str]:
    lines = [f"{k}: {lab}" for k, (_, lab) in sides.items()]
    vrows = version_rows(sides)
    if vrows:
        lines += ["", "Versions (A | B):"]
        lines += [f"  {n:<13} {a} | {b}" + ("   ≠ differs" if d else "") for n, a, b, d in vrows]
    if _differing(sides):
        lines.append(
            f"warning: A and B differ in {', '.join(_differing(sides))}: a Δ may come from them, not the code"
        )
    lines += ["", *_sources(sides), ""]
    lines += _console_rows(df)
    for heading, rows in _others(df):
        lines += ["", f"{heading}:", *(f"  {r}" for r in rows)]
    if df.attrs.get("notes"):
        lines += ["", "Notes:"]
        for note in df.attrs["notes"]:  # within the console's width, as the table
            lines += textwrap.wrap(note, CONSOLE_WIDTH, initial_indent="  ", subsequent_indent="    ",
                                   break_on_hyphens=False, break_long_words=False)  # fmt: skip
    if gate_result:
        glines, final, status = gate_result
        lines += [*glines, *([final] if status != 2 else [])]  # 2: the final line is the error's
    return lines


def as_markdown(df: pd.DataFrame, sides: dict, gate_result) -> list[str]:
    lines = ["### `bench compare`: B vs A", ""]
    lines += [f"- **{k}**: `{lab}` ({s.attrs['source']})" for k, (s, lab) in sides.items()]
    vrows = version_rows(sides)
    if vrows:
        lines += [
            "",
            *fmt.table(
                ["", "A", "B", ""],
                [[n, fmt.md(a), fmt.md(b), "⚠ differs" if d else ""] for n, a, b, d in vrows],
            ),
        ]
    shown = _rows(df)
    lines.append("")
    if len(shown):
        lines += fmt.table(
            list(shown.columns), [[fmt.md(v) for v in row] for row in shown.itertuples(index=False)]
        )
    else:
        lines.append("No workload is in both A and B.")
    for heading, rows in _others(df):
        lines += ["", f"**{heading}**", "", *(f"- {fmt.md(r)}" for r in rows)]
    if df.attrs.get("notes"):
        lines += ["", "**Notes**", "", *(f"- {fmt.md(n)}" for n in df.attrs["notes"])]
    if gate_result:
        glines, final, status = gate_result
        lines += [
            "",
            "```",
            *[g for g in glines if g],
            "```",
            "",
            f"**{final}**" if status != 2 else f"**error: {final}**",
        ]
    return lines


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v.item() if hasattr(v, "item") else v


def as_json(df: pd.DataFrame, sides: dict, gate_result) -> dict:
    doc = {
        k.lower(): {"label": lab, "source": s.attrs["source"], "versions": s.attrs["versions"]}
        for k, (s, lab) in sides.items()
    }
    doc["versions_differ"] = _differing(sides)
    doc["rows"] = [{c: _clean(v) for c, v in r.items()} for r in df.to_dict(orient="records")]
    doc["notes"] = list(df.attrs.get("notes") or [])
    if gate_result:
        glines, final, status = gate_result
        doc["gate"] = {"lines": [g for g in glines if g], "verdict": final, "exit_status": status}
    return doc


def write_outputs(df: pd.DataFrame, sides: dict, out: Path, threshold, gate_result) -> None:
    write_csv(df, out / "compare.csv")
    atomic_write_text(out / "compare.md", "\n".join(as_markdown(df, sides, gate_result)) + "\n")
    atomic_write_text(out / "compare.json", render(df, sides, "json", gate_result) + "\n")
    la, lb = (lab for _, lab in sides.values())
    plot_compare(df[df["present"] == "both"], out / "compare.png", la, lb, threshold)
