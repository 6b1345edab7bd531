"""Summarise trainer run directories (run.json + metrics.jsonl) into a markdown table.

Usage: python scripts/summarize_runs.py DIR [--warmup 10]
Steady state = steps after the warm-up; samples/s = total samples / total time.
"""

import argparse
import json
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("dir", type=Path)
p.add_argument("--warmup", type=int, default=10)
args = p.parse_args()
print(
    "| run | status | steps | samples/s | s/step | torch peak alloc GiB | reserved GiB | loss @ last | MFU |"
)
print("|---|---|---|---|---|---|---|---|---|")
for run_json in sorted(args.dir.glob("*/run.json")):
    run = json.loads(run_json.read_text())
    lines = (run_json.parent / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines if x.strip()]
    steady = rows[args.warmup :] or rows
    if not steady:
        print(f"| {run_json.parent.name} | {run['status']} ({run.get('reason')}) | 0 | | | | | | |")
        continue
    t = sum(r["step_time_s"] for r in steady)
    sps = sum(r["samples"] for r in steady) / t
    mfu = [r["mfu"] for r in steady if r.get("mfu") is not None]
    mfu_s = f"{100 * sum(mfu) / len(mfu):.1f}%" if mfu else "n/a"
    print(
        f"| {run_json.parent.name} | {run['status']} | {len(rows)} | {sps:.2f} | {t / len(steady):.3f} | "
        f"{max(r['torch_peak_allocated_gib'] for r in rows):.2f} | {max(r['torch_peak_reserved_gib'] for r in rows):.2f} | "
        f"{rows[-1]['loss']:.4f} | {mfu_s} |"
    )
