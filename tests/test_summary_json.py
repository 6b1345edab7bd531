"""summary.json (bench/results/summary_json.py): the sweep's verdict as data. It validates against
the shipped schema, the schema is the one the registry and the verdict enums make, and each
summary.json the report writes from a sweep's records agrees with its summary.csv (Δs, CIs, verdict
kinds) and training_parity.csv."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bench.results import summary_json
from bench.results.summary_json import ARM_FIELDS, SCHEMA_PATH, schema, schema_text, verdict
from bench.results.verdicts import Parity, Speed, parity_kind, speed_kind
from tests.test_aggregate import write_run

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parent.parent
SWEEPS = sorted(p.parent for p in (REPO / "results").glob("*/summary.json"))
FIXTURES = sorted(p.parent for p in (REPO / "tests" / "data" / "sweeps").glob("*/raw.tar.xz"))
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def _errors(doc: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def test_the_shipped_schema_is_the_one_the_registry_and_the_enums_make():
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_PATH.read_text()))
    assert SCHEMA_PATH.read_text() == schema_text(), (
        "bench/results/summary.schema.json is stale: `python -m bench.results.summary_json` writes it again"
    )
    defs = schema()["$defs"]
    kinds = {name: d["oneOf"][1]["properties"]["kind"]["enum"] for name, d in defs.items()}
    assert kinds == {"speed_verdict": [m.name for m in Speed], "parity_verdict": [m.name for m in Parity]}


def test_a_verdict_is_a_kind_and_its_words_and_no_other_kind_passes():
    assert verdict("within ±1.0%", Speed) == {"kind": "WITHIN", "text": "within ±1.0%"}
    control = "negative control (caught)"
    assert verdict(control, Parity) == {"kind": "CONTROL", "text": control}
    assert verdict(float("nan"), Speed) is None and verdict("", Parity) is None
    with pytest.raises(ValueError, match="no Speed member"):
        verdict("quicker", Speed)  # words no producer writes: a new member first
    bad = {"kind": "QUICKER", "text": "quicker"}
    assert not jsonschema.Draft202012Validator(schema()["$defs"]["speed_verdict"]).is_valid(bad)


def test_a_fixture_sweep_writes_a_summary_json_that_validates(tmp_path, no_plots):
    for rep, t in enumerate([0.80, 0.82, 0.79]):
        write_run(tmp_path, "baseline", rep, [1.0, 1.02, 0.99, 1.01])
        write_run(tmp_path, "liger", rep, [t] * 4)
        write_run(tmp_path, "rmsnorm", rep, [0.9 + rep / 100] * 4)
    argv = ["python", "-m", "bench", "sweep", "c.yaml"]
    config = {"contrasts": [["liger", "rmsnorm"]]}
    sweep = {"name": "fixture", "git_commit": "abc123", "argv": argv, "config": config}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    from bench.results.report import build_report

    built = build_report(tmp_path)
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text and built["paths"]["summary.json"] == tmp_path / "summary.json"
    doc = json.loads(text)
    assert _errors(doc) == []
    assert doc["sweep"]["name"] == "fixture" and doc["sweep"]["argv"] == argv
    assert doc["versions"]["torch_version"] == "2.13.0" and doc["has_training_parity"] is False
    (cell,) = doc["cells"]
    arms = {a["arm"]: a for a in cell["arms"]}
    assert arms["baseline"]["verdict_speed"] is None and arms["baseline"]["n_pairs"] is None
    liger = arms["liger"]
    assert (liger["n_runs"], liger["n_ok"], liger["n_pairs"]) == (3, 3, 3)
    assert liger["verdict_speed"]["kind"] == "FASTER" and liger["loss_parity"]["kind"] == "PASS"
    assert liger["delta_samples_per_s_pct_ci95_low"] < liger["delta_samples_per_s_pct"]
    (contrast,) = cell["contrasts"]
    assert (contrast["arm"], contrast["reference"]) == ("liger", "rmsnorm")
    assert contrast["verdict_speed"]["kind"] == "FASTER"
    # the manifest covers the CSVs `bench compare` reads, not summary.json (nor report.md)
    assert "summary.json" not in json.loads((tmp_path / "manifest.json").read_text())["files"]


def _same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    if isinstance(a, str):
        return a == b
    return b is not None and math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)


@pytest.mark.parametrize("sweep", SWEEPS, ids=[p.name for p in SWEEPS])
def test_a_committed_sweeps_summary_json_still_validates(sweep: Path):
    """The shipped schema still accepts what was published with it (a schema change that breaks the
    committed files fails here)."""
    assert _errors(json.loads((sweep / "summary.json").read_text())) == [], sweep.name


@pytest.fixture
def fixture_plots_off(no_plots, monkeypatch):
    """conftest's no_plots, and the plots only some fixture sweeps have."""
    from bench.results import plots, report

    for name in ("plot_scaling", "plot_capacity"):
        monkeypatch.setattr(plots, name, lambda *args, **kw: Path(args[-1]))
    monkeypatch.setattr(report, "plot_training_parity", lambda *args, **kw: Path(args[-1]))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_a_rebuilt_sweeps_summary_json_validates_and_agrees_with_its_csvs(
    fixture: Path, tmp_path, fixture_plots_off
):
    """The fixture sweeps' raw records (tests/data/sweeps/) rebuilt by `bench report` here: the
    summary.json the code writes now says what its summary.csv and training_parity.csv say (every
    arm, field by field, each verdict's kind and words; each arm's own training-parity rows)."""
    from bench.results import rawdata
    from bench.results.report import build_report

    sweep = rawdata.unpacked_copy(fixture, tmp_path / fixture.name)
    for name in ("summary.json", "summary.csv", "training_parity.csv"):
        (sweep / name).unlink(missing_ok=True)  # only what the rebuild writes is compared
    build_report(sweep)
    doc = json.loads((sweep / "summary.json").read_text())
    assert _errors(doc) == [], sweep.name
    csv = pd.read_csv(sweep / "summary.csv", dtype={"workload_digest": str})
    rows = {(r["cell_id"], r["arm"]): r for _, r in csv.iterrows()}
    arms = [(cell, arm) for cell in doc["cells"] for arm in cell["arms"]]
    assert len(arms) == len(rows) > 0
    for cell, arm in arms:
        row = rows[(cell["cell_id"], arm["arm"])]
        for name in ARM_FIELDS:
            if name in summary_json.VERDICTS:
                kind = (parity_kind if name == "loss_parity" else speed_kind)(row[name])
                assert (arm[name] or {}).get("kind") == (kind.name if kind else None), (sweep.name, name)
                assert (arm[name] or {}).get("text") == (row[name] if kind else None)
            else:
                assert _same(arm[name], row[name]), (sweep.name, cell["cell_id"], arm["arm"], name)
    parity = sweep / "training_parity.csv"
    assert doc["has_training_parity"] == parity.exists()
    if parity.exists():
        table = pd.read_csv(parity)
        judged = [
            (c["cell_id"], a["arm"], p["metric"], p["verdict"]["text"])
            for c, a in arms
            for p in a["training_parity"]
        ]
        assert sorted(judged) == sorted(
            zip(table.cell_id, table.arm, table.metric, table.verdict, strict=True)
        )


def test_the_description_names_every_field_and_kind_of_the_schema():
    text = (REPO / "docs" / "summary-json.md").read_text()

    def names(node) -> set[str]:
        found = set()
        if isinstance(node, dict):
            found |= set(node.get("properties", {}))
            for value in node.values():
                found |= names(value)
        elif isinstance(node, list):
            for value in node:
                found |= names(value)
        return found

    missing = sorted(n for n in names(schema()) if f"`{n}`" not in text and f"`{n}" not in text)
    assert missing == [], f"docs/summary-json.md does not name {missing}"
    assert all(m.name in text for m in (*Speed, *Parity))
