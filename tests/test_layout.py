"""The code's shape: no import cycle, arrows pointing one way, no two packages importing each
other, small modules and functions; every CSV column declared once, in the column registry
(bench/results/columns.py), and named nowhere else.

Imports are read with ``ast`` (function-local ones included: a lazy import still ties two
modules together), so a cycle fails here, not at an unlucky import order at run time.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bench.results.columns import (
    OPTIONAL_REPORT_FILES,
    REPORT_FILES,
    RUNS_COLUMNS,
    SUMMARY_AGGREGATES,
    TABLES,
)
from bench.results.report import build_report

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("bench", "specforge")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80

# Layers of bench/, lowest first: a module may import its own layer or lower ones only.
# Results and probes never reach up into the run loop; the run loop never into kernels.
LAYERS = [
    ("bench.fileio", "bench.fmt", "bench.errors", "bench.arms", "bench.distribution", "bench.record"),
    ("bench.config",),
    ("bench.probe", "bench.results", "bench.procs"),
    ("bench.trainers",),
    ("bench.run",),  # the run loop: handed its engine (bench/run/engine.py), it never names Slurm
    ("bench.slurm",),  # an engine of the run loop (job steps, stop signals), `bench submit`, status
    ("bench.kernels",),
    ("bench.__main__",),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (a package import counts as its __init__)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_pkg else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t in known and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (c := visit(m)):
            return c
    return None


def layer(mod: str) -> int | None:
    if mod == "bench":  # the package's (empty) __init__
        return 0
    for i, prefixes in enumerate(LAYERS):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_no_import_cycle():
    g = graph()
    # a package's __init__ importing its own submodules is not a cycle of behaviour; count it anyway
    cycle = find_cycle(g)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_bench_imports_point_down_the_layers():
    bad = []
    for mod, deps in graph().items():
        if not mod.startswith("bench"):
            continue
        mine = layer(mod)
        assert mine is not None, f"{mod}: not in any layer of tests/test_layout.py"
        for d in deps:
            if d.startswith("bench") and layer(d) is not None and layer(d) > mine:
                bad.append(f"{mod} imports {d}")
    assert not bad, "; ".join(sorted(bad))


def test_the_trainer_never_imports_bench_and_only_kernels_import_the_trainer():
    g = graph()
    assert not [
        m for m, deps in g.items() if m.startswith("specforge") and any(d.startswith("bench") for d in deps)
    ]
    users = sorted(
        m for m, deps in g.items() if m.startswith("bench") and any(d.startswith("specforge") for d in deps)
    )
    assert all(m.startswith("bench.kernels.") for m in users), users


@pytest.mark.parametrize("mod", sorted(modules()))
def test_modules_are_small_and_say_their_job(mod):
    path = modules()[mod]
    text = path.read_text()
    tree = ast.parse(text)
    lines = len(text.splitlines())
    assert lines <= MAX_FILE_LINES, f"{path.relative_to(REPO)}: {lines} lines (at most {MAX_FILE_LINES})"
    if lines > 5:
        assert ast.get_docstring(tree), f"{path.relative_to(REPO)}: no module docstring saying its job"
    long = [
        f"{n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.relative_to(REPO)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"


# ---------------------------------------------------------------- the structure docs/design.md claims


def package_of(mod: str) -> str:
    """``bench.run.sweep`` -> ``bench.run``; a top-level module of bench is its own package."""
    parts = mod.split(".")
    return ".".join(parts[:2])


def package_ties(g: dict[str, set[str]]) -> list[str]:
    """Pairs of bench's packages that import each other (in either direction, any module)."""
    edges = {
        (package_of(m), package_of(d))
        for m, deps in g.items()
        for d in deps
        if m.startswith("bench.") and d.startswith("bench.") and package_of(m) != package_of(d)
    }
    return sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)


def test_no_two_packages_import_each_other():
    assert package_ties(graph()) == []


def test_the_tie_finder_finds_ties():
    g = {"bench.run.a": {"bench.slurm.b"}, "bench.slurm.b": set(), "bench.slurm.c": {"bench.run.d"}}
    assert package_ties(g) == ["bench.run <-> bench.slurm"]


def registered_trainers() -> list:
    from bench.trainers import registered

    return list(registered().values())


def test_the_config_layer_names_no_trainer():
    """bench/config validates trainer-neutral keys: no registered trainer's name, module or package
    appears in its code, strings or comments (each trainer's package owns what it knows)."""
    words = {"specforge"}  # our trainer's module (its name is the embedded trainer's module too)
    for t in registered_trainers():
        words |= {t.name, t.name.replace("-", "_"), f"bench.trainers.{t.name.replace('-', '_')}"}
        words |= {t.reader.module} - {None}
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(words))) + r")(?![\w-])", re.I)
    hits = []
    for path in sorted((REPO / "bench" / "config").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            # "the run contract" is the suite's own interface, not the contract trainer's name
            for m in pattern.finditer(line):
                if m.group(1).lower() == "contract" and "run contract" in line.lower():
                    continue
                hits.append(f"{path.relative_to(REPO)}:{n}: {m.group(1)}")
    assert not hits, hits


def test_each_trainer_is_a_package_registered_in_one_line():
    from bench.trainers import TRAINERS

    src = (REPO / "bench" / "trainers" / "__init__.py").read_text()
    for module in TRAINERS:
        path = REPO / Path(*module.split("."))
        assert (path / "__init__.py").is_file(), f"{module}: not a package"
        assert sum(f'"{module}"' in line for line in src.splitlines()) == 1, module
    names = [t.name for t in registered_trainers()]
    assert len(set(names)) == len(names)


def test_each_trainer_name_is_spelled_once_in_bench():
    """A trainer's name is a string literal in one module of bench (its own package's, or the
    results' name for records that predate the trainer column); every other module uses it."""
    for t in registered_trainers():
        spelled = []
        for path in sorted((REPO / "bench").rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value == t.name:
                    spelled.append(str(path.relative_to(REPO)))
        assert len(spelled) == 1, f"{t.name!r} spelled in {spelled}"


# Module names that name a role every package may have (a package's own CLI, its report, ...).
SHARED_ROLE_NAMES = {"__init__", "__main__", "cli", "report", "plug", "facts"}


def test_no_two_modules_share_a_name_for_different_jobs():
    """Two modules named alike (``config/sweep.py`` and ``run/sweep.py``) read as one job; each
    name says its job once, but for the per-package roles above."""
    by_name: dict[str, list[str]] = {}
    for mod in modules():
        if mod.startswith("bench"):
            by_name.setdefault(mod.split(".")[-1], []).append(mod)
    dupes = {n: m for n, m in by_name.items() if len(m) > 1 and n not in SHARED_ROLE_NAMES}
    assert not dupes, dupes


def test_a_run_id_is_built_and_parsed_in_one_place():
    """Every run id (runs/, prime/, a profile's) is built by bench/config/model.py's run_id,
    prime_run_id or profile_run_id and read back by its parse_run_id: no other module spells the
    ``_r<repeat>`` or ``_prime<i>`` suffix, and none parses ids with its own pattern."""
    home = REPO / "bench" / "config" / "model.py"
    spelled = re.compile(r"""f["'][^"']*_(?:r|prime)\{""")
    parsed = re.compile(r"""_r\(\?P<repeat>|_r\\\\d""")
    found = [
        f"{path.relative_to(REPO)}:{i}"
        for path in modules().values()
        if path != home
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line) or parsed.search(line)
    ]
    assert not found, found


# ---------------------------------------------------------------- the run records: bench/record.py

RECORD_HOME = REPO / "bench" / "record.py"
# A string naming one of a run directory's record files (alone, or as a path's last part: "*/cell.json").
RECORD_FILE = re.compile(r"(?:^|[/\\*])(?:run\.json|cell\.json|metrics\.jsonl)$")
# What bench/ calls a run record (and RunRecord's .cell / .run): a run.json or cell.json key read off
# one of these by string (``doc["status"]``, ``cell.get("repeat")``, ``(cell or {}).get("slurm")``)
# bypasses the typed record. The tables share the records' names on purpose (runs.csv's status, arm,
# cell_id, ...) and are pandas objects named otherwise (df, runs, g, row): no static check tells a
# DataFrame's column from a dict's key, so the check goes by the receiver's name.
RECORD_NAMES = {"cell", "doc", "run", "record", "cell_doc", "run_doc"}
# (module, receiver) -> (keys, why): where a record's name holds another object with such a key.
OTHER_OBJECTS: dict[tuple[str, str], tuple[set[str], str]] = {
    ("bench/probe/nodevram.py", "doc"): (
        {"status", "reason"},
        "one node's VRAM summary (vram_node_<n>.json)",
    ),
    ("bench/results/history.py", "doc"): (
        {"sweep"},
        "a sweep's summary.json (bench/results/summary_json.py)",
    ),
    ("bench/run/ab.py", "doc"): ({"trainer", "precision"}, "the sweep config `bench ab` writes (ab.yaml)"),
    ("bench/run/ab.py", "cell"): ({"set"}, "that sweep config's cells entry"),
    ("bench/trainers/specforge_cli/instrument.py", "doc"): (
        {"profile"},
        "the probe's own record of SpecForge",
    ),
}


def docstring_nodes(tree: ast.AST) -> set[int]:
    """The ids of the docstrings' Constant nodes (a docstring may name the files)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def record_file_literals(source: str) -> list[tuple[int, str]]:
    """(line, string) of each string constant but a docstring that names a record file."""
    tree = ast.parse(source)
    skip = docstring_nodes(tree)
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
        and RECORD_FILE.search(n.value)
    ]  # fmt: skip


def receiver(node: ast.AST) -> str | None:
    """The name a subscript or .get is applied to: ``doc``, ``rec.cell`` -> cell, ``(cell or {})`` -> cell."""
    while isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        node = node.values[0]
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def record_key_reads(source: str, keys: set[str]) -> list[tuple[int, str, str, str]]:
    """(line, receiver, key, code) of each ``X["key"]`` and ``X.get("key", ...)`` (also .pop,
    .setdefault) with X named as a record and "key" one of run.json's or cell.json's fields."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Subscript):
            target, key = n.value, n.slice
        elif (
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args
            and n.func.attr in ("get", "pop", "setdefault")
        ):  # fmt: skip
            target, key = n.func.value, n.args[0]
        else:
            continue
        name = receiver(target)
        if isinstance(key, ast.Constant) and key.value in keys and name in RECORD_NAMES:
            found.append((n.lineno, name, key.value, ast.unparse(n)))
    return found


def record_keys() -> set[str]:
    from dataclasses import fields

    from bench.record import CellDoc, RunDoc

    return {f.name for cls in (CellDoc, RunDoc) for f in fields(cls)} - {"extra", "_keys"}


def test_only_bench_record_names_the_record_files_and_reads_their_keys():
    """cell.json, run.json and metrics.jsonl are read and written through bench/record.py alone:
    no other module of bench/ spells their names (docstrings may), and none reads a run.json or
    cell.json key by string off a record (records are read by attribute: ``doc.status``)."""
    keys = record_keys()
    names, reads, exempted = [], [], set()
    for path in sorted((REPO / "bench").rglob("*.py")):
        if path == RECORD_HOME:
            continue
        rel, source = str(path.relative_to(REPO)), path.read_text()
        names += [f"{rel}:{line}: {text!r}" for line, text in record_file_literals(source)]
        for line, name, key, code in record_key_reads(source, keys):
            if key in OTHER_OBJECTS.get((rel, name), (set(), ""))[0]:
                exempted.add((rel, name))
            else:
                reads.append(f"{rel}:{line}: {code}")
    assert not names, "record files named outside bench/record.py: " + "; ".join(names)
    assert not reads, "record keys read by string: " + "; ".join(reads)
    assert exempted == set(OTHER_OBJECTS), f"stale exemptions: {sorted(set(OTHER_OBJECTS) - exempted)}"


def test_the_record_checks_catch_what_they_mean():
    source = (
        '"""Reads run.json."""\n'
        'P, G, M = "run.json", "*/cell.json", f"{d}/metrics.jsonl"\n'
        'S = "run.json is torn"\n'
        'a, b, c = doc["status"], rec.cell.get("repeat"), (cell or {}).get("slurm")\n'
        'd, e, f = df["status"], doc.get("order"), exit_doc.get("exit_code")\n'
    )
    assert [text for _, text in record_file_literals(source)] == ["run.json", "*/cell.json", "/metrics.jsonl"]
    assert [code for *_, code in record_key_reads(source, record_keys())] == [
        "doc['status']", "rec.cell.get('repeat')", "(cell or {}).get('slurm')",
    ]  # fmt: skip


# ---------------------------------------------------------------- the column registry

REGISTRY = sorted((REPO / "bench" / "results").glob("columns*.py"))  # columns.py, columns_spec.py, ...
# Module-level column lists allowed outside the registry: frames a plot draws (forest.py,
# plots.py, runplots.py), which no CSV holds (the header check below would see one), and
# `bench kernels`' own kernels.csv and kernel_buckets.csv (bench/kernels, docs/kernels.md).
NOT_REGISTRY_LISTS = {
    "FOREST_COLUMNS", "THROUGHPUT_BAR_COLUMNS", "LOSS_GAP_COLUMNS", "KERNEL_COLUMNS", "BUCKET_COLUMNS",
}  # fmt: skip


def _string_elements(node: ast.AST) -> bool:
    """A list/tuple/set display (or a ``+`` of displays) with a string literal among its elements."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _string_elements(node.left) or _string_elements(node.right)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    return False


def column_list_violations(sources: dict[str, str], registry: set[str]) -> list[str]:
    """``module: NAME`` for each module-level list of column names outside ``registry`` that some
    module of ``sources`` (module name -> source text) passes as ``columns=``."""
    trees = {m: ast.parse(text) for m, text in sources.items()}
    passed = {
        n.id
        for tree in trees.values()
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        for kw in call.keywords
        if kw.arg == "columns"
        for n in ast.walk(kw.value)
        if isinstance(n, ast.Name)
    }
    found = []
    for mod, tree in trees.items():
        if mod in registry:
            continue
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            value = getattr(stmt, "value", None)
            for t in targets:
                if (
                    isinstance(t, ast.Name)
                    and t.id in passed
                    and value is not None
                    and _string_elements(value)
                ):
                    found.append(f"{mod}: {t.id}")
    return found


def test_every_column_list_comes_from_the_registry():
    """The rule: no module under bench/ but the registry (bench/results/columns*.py) binds, at module
    level, a name to a list, tuple or set display holding a string literal (``X = ["a", ...]``,
    ``X = [*Y, "a"]``, ``X = Y + ["a"]``) when that name is passed anywhere in bench/ as a
    ``columns=`` argument (``pd.DataFrame(columns=X)``, ``df.reindex(columns=X)``, ``to_csv``).
    Lists derived from the registry (``TABLES["runs.csv"].names``, a comprehension over one) are
    fine. NOT_REGISTRY_LISTS are the exceptions, each with its reason."""
    sources = {m: p.read_text() for m, p in modules().items() if m.startswith("bench")}
    registry = {module_name(p) for p in REGISTRY}
    found = [
        v for v in column_list_violations(sources, registry) if v.split(": ")[1] not in NOT_REGISTRY_LISTS
    ]
    assert not found, (
        f"column lists outside the registry (declare them in bench/results/columns*.py): {found}"
    )


def test_the_column_list_rule_finds_a_list_outside_the_registry():
    writer = "import pandas as pd\ndef table(rows):\n    return pd.DataFrame(rows).reindex(columns=EXTRA)\n"
    for decl in ('EXTRA = [*RUNS_COLUMNS, "x"]', 'EXTRA = ("a", "b")', 'EXTRA = RUNS_COLUMNS + ["x"]'):
        sources = {"bench.results.w": f"{decl}\n{writer}", "bench.results.columns": decl}
        assert column_list_violations(sources, {"bench.results.columns"}) == ["bench.results.w: EXTRA"]
    derived = {"bench.results.w": f'EXTRA = TABLES["runs.csv"].names\n{writer}'}
    assert column_list_violations(derived, set()) == []
    unused = {"bench.results.w": 'EXTRA = ["a"]\nKEYS = ["b"]\n'}  # no columns= of them: not a column list
    assert column_list_violations(unused, set()) == []


def _header(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\n").split(",")


def undeclared(csvs: list[Path]) -> dict[str, list[str]]:
    """Per CSV whose header is not its registry table's columns in order: the undeclared ones."""
    return {
        f"{p.parent.name}/{p.name}": [c for c in _header(p) if c not in TABLES[p.name].names]
        for p in csvs
        if _header(p) != TABLES[p.name].names
    }


REPORT_CSVS = [f for f in REPORT_FILES + OPTIONAL_REPORT_FILES if f.endswith(".csv")]


def test_every_csv_of_the_committed_sweeps_is_a_registry_table():
    """Every CSV `bench report` writes is a table of the registry, and each committed sweep's copy
    has the table's declared columns as its header, in order (runs, summary, loss_parity,
    vram_per_card, contrasts, trainers, scaling, capacity, training_parity): a column the report
    writes that the registry does not declare fails here once `make golden` has written it."""
    assert set(REPORT_CSVS) <= set(TABLES)
    csvs = sorted(p for f in REPORT_CSVS for p in (REPO / "results").glob(f"*/{f}"))
    assert {p.name for p in csvs} == set(REPORT_CSVS)  # each file the report writes seen at least once
    wrong = undeclared(csvs)
    assert not wrong, f"CSV headers that are not the registry's tables (undeclared columns listed): {wrong}"


def test_a_report_writes_only_declared_columns(tmp_path, monkeypatch):
    """The same for a sweep reported here, by this checkout's code (before any `make golden`)."""
    from tests.test_aggregate import write_run

    monkeypatch.setenv("BENCH_NO_PLOTS", "1")
    for arm in ("baseline", "liger"):
        write_run(tmp_path, arm, 0, [1.0] * 4)
    build_report(tmp_path)
    csvs = sorted(tmp_path.glob("*.csv"))
    assert {p.name for p in csvs} == {"runs.csv", "summary.csv", "loss_parity.csv", "vram_per_card.csv"}
    wrong = undeclared(csvs)
    assert not wrong, f"CSV headers that are not the registry's tables (undeclared columns listed): {wrong}"


def test_the_registry_declares_each_column_once_per_table_with_a_meaning():
    runs = TABLES["runs.csv"]
    for c in SUMMARY_AGGREGATES:  # summary.csv's plain aggregates name a numeric runs.csv column
        assert c.of in RUNS_COLUMNS and runs.column(c.of).numeric, c
    for t in TABLES.values():
        assert len(set(t.names)) == len(t.names), t.file
        assert all(c.text.strip() for c in t.columns), t.file
