"""Summarise trainer run directories (run.json + metrics.jsonl, no sweep) into a markdown table.

Usage: python scripts/summarize_runs.py DIR [--warmup 10]

Throughput has one definition in this project, bench.results.records.run_row: the steps after the
warm-up (by step number), total samples / total step time.
"""

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.results.records import load_run, run_row  # noqa: E402


def _f(x, spec: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir", type=Path)
    p.add_argument("--warmup", type=int, default=10, help="steps dropped before measuring (by step number)")
    args = p.parse_args()
    print(
        "| run | status | steps | samples/s | s/step | torch peak alloc GiB | reserved GiB | loss @ last | MFU |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for run_json in sorted(args.dir.glob("*/run.json")):
        rec = load_run(run_json.parent)
        rec.cell = {**rec.cell, "warmup_steps": args.warmup}
        r = run_row(rec)
        status = r["status"] if r["status"] == "ok" else f"{r['status']} ({r['reason']})"
        mfu = (
            _f(100 * r["mfu"], ".1f") + "%"
            if isinstance(r.get("mfu"), float) and r["mfu"] == r["mfu"]
            else "n/a"
        )
        print(
            f"| {run_json.parent.name} | {status} | {r['steps_total']} | {_f(r.get('samples_per_s'), '.2f')} | "
            f"{_f(r.get('s_per_step_mean'), '.3f')} | {_f(r['torch_peak_allocated_gib'], '.2f')} | "
            f"{_f(r['torch_peak_reserved_gib'], '.2f')} | {_f(r.get('loss_last'), '.4f')} | {mfu} |"
        )


if __name__ == "__main__":
    main()
