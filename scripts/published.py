"""Rebuild sweeps from their raw archives (bench/results/rawdata.py), for the make targets:

    python scripts/published.py golden              # tests/data/sweeps/*: write the expected files again
    python scripts/published.py verify [DIR ...]    # results/*: which published faces a rebuild moves
    python scripts/published.py republish DIR ...   # results/DIR: rebuild its face on purpose

Each sweep is unpacked into a temporary copy (its archive, raw.json and sweep.json) and rebuilt there
with `bench report`; nothing under results/ or tests/data/ is touched but by golden and republish,
which copy the rebuilt files back (republish also the figures of the face, not RECORD_FIGURES).
verify exits 1 when a face differs from its rebuild: the code moved it since the commit that built
it (raw.json's published_at_commit, or the runs' own commit), and `republish` brings it up to date.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.fileio import atomic_write_json, read_json  # noqa: E402
from bench.results import rawdata  # noqa: E402

FACE = list(rawdata.FACE)
FIGURES = ["forest.png", "scaling.png", "capacity.png", "training_parity.png"]
ALWAYS = {"runs.csv", "summary.csv", "forest.png"}  # every sweep has these; the others only where they apply


def rebuilt(sweep: Path, tmp: Path) -> Path:
    """A temporary copy of ``sweep`` unpacked and rebuilt by `bench report` (exit 4, a parity
    failure the report states, counts as rebuilt)."""
    out = rawdata.unpacked_copy(sweep, tmp / sweep.name)
    r = subprocess.run(
        [sys.executable, "-m", "bench", "report", str(out)], cwd=REPO, capture_output=True, text=True
    )
    if r.returncode not in (0, 4):
        raise SystemExit(f"{sweep}: bench report failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return out


def copy_back(src: Path, dst: Path, names: list[str]) -> list[str]:
    done = []
    for name in names:
        if (src / name).exists() and ((dst / name).exists() or name in ALWAYS):
            shutil.copyfile(src / name, dst / name)
            done.append(name)
    return done


def committed() -> list[Path]:
    return sorted(p.parent for p in (REPO / "results").glob(f"*/{rawdata.RAW}"))


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("golden", "verify", "republish"):
        print(__doc__, file=sys.stderr)
        return 2
    action, dirs = argv[0], [Path(d).resolve() for d in argv[1:]]
    if action == "golden":
        dirs = sorted(p.parent for p in (REPO / "tests" / "data" / "sweeps").glob(f"*/{rawdata.RAW}"))
    elif action == "verify":
        dirs = dirs or committed()
    elif not dirs:
        print("republish: name the sweep directories", file=sys.stderr)
        return 2
    stale = []
    for sweep in dirs:
        with tempfile.TemporaryDirectory(prefix="bench-published-") as tmp:
            out = rebuilt(sweep, Path(tmp))
            if action == "verify":
                differ = [
                    n
                    for n in FACE
                    if (sweep / n).exists()
                    and (not (out / n).exists() or (out / n).read_bytes() != (sweep / n).read_bytes())
                ]
                print(f"{sweep.relative_to(REPO)}: {'moved: ' + ', '.join(differ) if differ else 'same'}")
                stale += [sweep] if differ else []
                continue
            names = copy_back(out, sweep, FACE + (FIGURES if action == "republish" else []))
            if action == "republish":
                doc = read_json(sweep / rawdata.RAW_JSON) or {}
                commit = subprocess.run(
                    ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True
                )
                atomic_write_json(
                    sweep / rawdata.RAW_JSON, {**doc, "published_at_commit": commit.stdout.strip() or None}
                )
            print(f"{sweep.relative_to(REPO)}: wrote {', '.join(names)}")
    if stale:
        print(
            f"{len(stale)} of {len(dirs)} published faces differ from their rebuild: `make republish SWEEP=...`"
        )
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
