"""Config inputs YAML 1.1 reads wrongly or silently, and sizes past what a sweep can run or name:
each refused (or read as meant) in one line, before anything is written."""

from __future__ import annotations

import time

import pytest
import yaml

from bench.config import SweepError
from bench.config.yamlio import load
from bench.trainers import load_config
from specforge.config import ConfigError, load_yaml
from tests.helpers import CONFIGS

TINY = str(CONFIGS / "train" / "tiny-offline.yaml")


def write(tmp_path, text: str):
    p = tmp_path / "sweep.yaml"
    p.write_text(text)
    return p


BASE = f"""name: t
hardware: cpu
steps: 4
warmup_steps: 1
cells:
  - {{config: {TINY}, batch_size: 2, seq_len: 128}}
"""


def test_exponents_without_a_dot_are_numbers_and_ints_stay_ints():
    doc = load("a: 1e3\nb: 3e-3\nc: 6.0e-4\nd: 1000\ne: '1e3'\nf: .5\ng: 0x10\n")
    assert doc == {"a": 1000.0, "b": 0.003, "c": 0.0006, "d": 1000, "e": "1e3", "f": 0.5, "g": 16}
    assert isinstance(doc["d"], int)
    assert yaml.safe_load("a: 1e3") == {"a": "1e3"}  # PyYAML's own loader is left as it was


def test_a_sweep_config_reads_5e_2_as_the_number_it_is(tmp_path):
    cfg = load_config(write(tmp_path, BASE + "poll_interval_s: 5e-2\ntimeout_s: 3e2\n"))
    assert cfg.poll_interval_s == 0.05 and cfg.timeout_s == 300.0


def test_a_duplicate_key_is_refused_with_its_line(tmp_path):
    with pytest.raises(SweepError) as e:
        load_config(write(tmp_path, BASE + "steps: 40\n"))
    assert str(e.value).endswith("not valid YAML: duplicate key 'steps' (line 7)")


def test_the_trainer_reads_its_configs_alike(tmp_path):
    p = tmp_path / "train.yaml"
    p.write_text("training: {lr: 3e-3, steps: 10}\n")
    assert load_yaml(p)["training"]["lr"] == 0.003
    p.write_text("training: {lr: 3e-3}\nmodel: {}\ntraining: {steps: 3}\n")
    with pytest.raises(ConfigError, match="duplicate key 'training' at line 3"):
        load_yaml(p)


@pytest.mark.parametrize(
    "extra, expected",
    [
        ("repeats: 1000000000000\n", "repeats: expected at most 100 pairs per cell, got 1000000000000"),
        ("arms: [baseline, aa, nopoll]\nrepeats: 100\n", None),
    ],
)
def test_absurd_counts_are_refused_at_once(tmp_path, extra, expected):
    t0 = time.monotonic()
    if expected is None:
        assert len(load_config(write(tmp_path, BASE + extra)).arms) == 3  # 300 runs: fine
        return
    with pytest.raises(SweepError) as e:
        load_config(write(tmp_path, BASE + extra))
    assert expected in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 5


def test_too_many_runs_and_too_many_steps_are_refused(tmp_path):
    many = BASE.replace("batch_size: 2", "batch_size: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]").replace(
        "seq_len: 128", f"seq_len: {list(range(64, 64 + 64 * 20, 64))}"
    )
    with pytest.raises(SweepError, match=r"200 cells x 2 arms x 100 pairs = 40000 runs; at most 10000"):
        load_config(write(tmp_path, many + "repeats: 100\n"))
    with pytest.raises(SweepError, match="steps: expected at most 1000000 optimizer steps per run"):
        load_config(write(tmp_path, BASE.replace("steps: 4", "steps: 2000000")))


def test_a_label_too_long_for_a_file_name_is_refused(tmp_path):
    text = BASE.replace("seq_len: 128}", "seq_len: 128, label: " + "x" * 240 + "}")
    with pytest.raises(SweepError) as e:
        load_config(write(tmp_path, text))
    assert "run directories' names would be" in str(e.value) and "over the file system's 255" in str(e.value)


def test_a_binary_file_where_a_config_belongs_is_one_line(tmp_path):
    blob = bytes(range(256)) * 8
    (tmp_path / "bin.yaml").write_bytes(blob)
    with pytest.raises(SweepError, match="bin.yaml: not a text file; expected a YAML sweep config"):
        load_config(tmp_path / "bin.yaml")
    with pytest.raises(SweepError, match="is not a text file; expected a YAML training config"):
        load_config(write(tmp_path, BASE.replace(TINY, str(tmp_path / "bin.yaml"))))
    with pytest.raises(ConfigError, match="not a text file; expected a YAML config"):
        load_yaml(tmp_path / "bin.yaml")


def test_compare_given_a_directory_says_so(tmp_path, capsys):
    from bench.__main__ import main

    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"error: {tmp_path}: is a directory; expected a summary.csv or runs.csv (e.g. {tmp_path}/summary.csv)"
    )


def test_a_hardware_override_naming_a_gpu_the_machine_lacks_is_refused_up_front(
    tmp_path, monkeypatch, capsys
):
    from bench.__main__ import main
    from bench.probe import hardware

    monkeypatch.setenv("BENCH_HARDWARE", "h200")
    info = {
        "kind": "h200",
        "kind_source": "BENCH_HARDWARE",
        "gpu_count": 0,
        "gpu_names": [],
        "vendor": "none",
    }
    assert hardware.check_hardware(["h100", "h200"], info).startswith(
        "BENCH_HARDWARE=h200 names a GPU kind, but this machine has no GPU"
    )
    real_gpu = {**info, "gpu_count": 1, "gpu_names": ["NVIDIA H100 NVL"]}  # an override on a real GPU stands
    assert hardware.check_hardware(["h100", "h200"], real_gpu) is None
    monkeypatch.setattr(hardware, "detect", lambda: info)
    out = tmp_path / "out"
    assert main(["sweep", str(CONFIGS / "h200.yaml"), "--out", str(out)]) == 2
    assert "names a GPU kind, but this machine has no GPU" in capsys.readouterr().err
    assert not out.exists()
