"""`bench export --to mlflow`: a sweep as one MLflow experiment named after it, with mlflow-skinny's
client (MlflowClient; no server, no global tracking state). One MLflow run per benchmark run (its
identity and versions as tags, its cell as params, its steps as the metrics ``step/<metric>`` and
its runs.csv numbers as metrics at step 0) and a run ``summary`` (each summary.csv number as the
metric ``<cell_id>/<arm>/<column>``, each verdict's words as the tag of that name).

Where it goes: ``--out`` given, a local file store there; else the user's MLFLOW_TRACKING_URI
when set (their configuration: a server is written to only then); else the file store
SWEEP/tracker/mlruns. MLflow 3.x refuses a file store unless MLFLOW_ALLOW_FILE_STORE=true (its
documented opt-out): set for the call around our own local store only. MLflow's usage telemetry
is off for the call unless the user set MLFLOW_DISABLE_TELEMETRY or DO_NOT_TRACK.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from bench.results.export_data import SweepExport, TrackerRun, env_defaults, fresh_dir, need

SUMMARY_RUN = "summary"
KIND_TAG = "bench.kind"  # "run" or "summary"
# MLflow 3's usage telemetry (on by default, sent to MLflow's servers): off unless the user set it.
TELEMETRY_OFF = {"MLFLOW_DISABLE_TELEMETRY": "true"}
_BATCH = 100  # MLflow's most params or tags per log_batch (its metrics: 1000)
_TEXT_MAX = 5000  # under MLflow's 6000 characters of a param value (8000 of a tag's)
_BAD_KEY = re.compile(r"[^\w\-. /:]")


def _key(name: str) -> str:
    return _BAD_KEY.sub("_", name)


def _value(text: str) -> str:
    return text if len(text) <= _TEXT_MAX else text[: _TEXT_MAX - 1] + "…"


def tracking_uri(sweep_dir: Path, out: str | None) -> tuple[str, Path | None]:
    """(the tracking URI, the local store's folder or None for the user's own URI)."""
    if out is None and os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], None
    folder = Path(out) if out is not None else sweep_dir / "tracker" / "mlruns"
    return folder.resolve().as_uri(), folder


def _log(client, run_id: str, metrics=(), params=(), tags=()) -> None:
    for i in range(0, len(metrics), 10 * _BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + 10 * _BATCH])
    for i in range(0, max(len(params), len(tags)), _BATCH):
        client.log_batch(run_id, params=params[i : i + _BATCH], tags=tags[i : i + _BATCH])


def _run(client, entities, experiment_id: str, run: TrackerRun, sweep_tags: dict) -> None:
    Metric, Param, RunTag = entities.Metric, entities.Param, entities.RunTag
    now = int(time.time() * 1000)
    made = client.create_run(experiment_id, run_name=run.name, tags={KIND_TAG: "run"})
    rid = made.info.run_id
    metrics = [
        Metric(_key(k), v, int(when * 1000) if when is not None else now, step)
        for step, when, values in run.steps
        for k, v in values.items()
    ]
    metrics += [Metric(_key(k), v, now, 0) for k, v in run.totals.items()]
    tags = [RunTag(_key(k), _value(v)) for k, v in {**sweep_tags, **run.tags}.items()]
    params = [Param(_key(k), _value(v)) for k, v in run.params.items()]
    _log(client, rid, metrics, params, tags)
    client.set_terminated(rid, status="FINISHED" if run.ok else "FAILED")


def _summary(client, entities, experiment_id: str, sweep: SweepExport) -> None:
    Metric, RunTag = entities.Metric, entities.RunTag
    now = int(time.time() * 1000)
    rid = client.create_run(experiment_id, run_name=SUMMARY_RUN, tags={KIND_TAG: SUMMARY_RUN}).info.run_id
    metrics = [Metric(_key(f"{r.key}/{k}"), v, now, 0) for r in sweep.summary for k, v in r.numbers.items()]
    tags = [RunTag(_key(k), _value(v)) for k, v in sweep.tags.items()]
    tags += [RunTag(_key(f"{r.key}/{k}"), _value(v)) for r in sweep.summary for k, v in r.words.items()]
    _log(client, rid, metrics, (), tags)
    client.set_terminated(rid, status="FINISHED")


def export(sweep: SweepExport, out: str | None) -> tuple[str, list[str]]:
    """Write the experiment; (where it went, the lines to print)."""
    uri, folder = tracking_uri(sweep.sweep_dir, out)
    local = {"MLFLOW_ALLOW_FILE_STORE": "true"} if folder is not None else {}
    with env_defaults(TELEMETRY_OFF, unless=("DO_NOT_TRACK",)), env_defaults(local):
        entities = need("mlflow.entities", "mlflow", "mlflow-skinny")
        client_mod = need("mlflow.tracking", "mlflow", "mlflow-skinny")
        if folder is not None:
            fresh_dir(folder)
        client = client_mod.MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(sweep.name)
        experiment_id = found.experiment_id if found else client.create_experiment(sweep.name)
        for run in sweep.runs:
            _run(client, entities, experiment_id, run, sweep.tags)
        _summary(client, entities, experiment_id, sweep)
    where = f"experiment {sweep.name!r} at {uri}"
    if folder is None:
        return where, ["(MLFLOW_TRACKING_URI: your tracking server or store)"]
    view = f"view them: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {uri}"
    return where, [view]
