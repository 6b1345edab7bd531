"""The Liger patch really lands in the draft, whatever the import order, and only there."""

import subprocess
import sys
import textwrap
import types

import pytest

from specforge import liger
from specforge.config import ConfigError
from tests.helpers import REPO

BUILD = """
import torch
from specforge.config import load_profile
from specforge.liger import liger_patch
from specforge.draft import DFlashDraft
p = load_profile("tiny")
with liger_patch(True, "{scope}"):
    d = DFlashDraft(p.draft, 2, 64, 256)
from transformers.models.qwen3 import modeling_qwen3
layer = d.layers[0]
types = {{type(m).__name__ for m in (d.norm, d.hidden_norm, layer.mlp, layer.input_layernorm,
        layer.post_attention_layernorm, layer.self_attn.q_norm, layer.self_attn.k_norm)}}
print("DRAFT", sorted(types))
print("MODULE", modeling_qwen3.Qwen3RMSNorm.__name__, modeling_qwen3.Qwen3MLP.__name__)
"""

ORDERS = {
    "specforge first": "import specforge.draft\n",
    "transformers names captured first": (
        "from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, Qwen3MLP\n"
    ),
    "liger first": "import liger_kernel.transformers\n",
    "nothing first": "",
}


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.parametrize("order", list(ORDERS))
def test_patch_lands_whatever_import_order(order):
    out = _run(ORDERS[order] + textwrap.dedent(BUILD.format(scope="draft")))
    draft_line = next(line for line in out.splitlines() if line.startswith("DRAFT"))
    assert draft_line == "DRAFT ['LigerRMSNorm', 'LigerSwiGLUMLP']"
    # Draft scope: the module is restored, so a target built later keeps the stock classes.
    assert "MODULE Qwen3RMSNorm Qwen3MLP" in out


# Scenarios that do not depend on the import order share one interpreter (each patch is undone
# on leaving its block, which the scenarios after it check); the "all" scope, which leaves its
# patch in place, runs last. Each prints "<name> DRAFT [...]" / "<name> MODULE ..." lines.
SCENARIO = """
with liger_patch({flag}, "{scope}"{kernels}):
    d = DFlashDraft(p.draft, 2, 64, 256)
layer = d.layers[0]
print("{name} DRAFT", sorted({{type(m).__name__ for m in (d.norm, d.hidden_norm, layer.mlp,
      layer.input_layernorm, layer.post_attention_layernorm, layer.self_attn.q_norm, layer.self_attn.k_norm)}}))
print("{name} MODULE", modeling_qwen3.Qwen3RMSNorm.__name__, modeling_qwen3.Qwen3MLP.__name__)
"""
SCENARIOS = [  # name, liger on, scope, kernels
    ("baseline", False, "draft", ""),
    ("rmsnorm", True, "draft", ", rms_norm=True, swiglu=False"),
    ("swiglu", True, "draft", ", rms_norm=False, swiglu=True"),
    ("draft", True, "draft", ""),
    ("all", True, "all", ""),
]
PRELUDE = """
import torch
from specforge.config import load_profile, TargetConfig
from specforge.liger import liger_patch
from specforge.draft import DFlashDraft
from specforge.target import build_target
from transformers.models.qwen3 import modeling_qwen3
p = load_profile("tiny")
"""
AFTER_DRAFT = """
t = build_target(p.target, TargetConfig(), torch.device("cpu"), torch.float32, 0, 256)
print("TARGET", sorted({type(m).__name__ for m in t.modules() if "Norm" in type(m).__name__ or "MLP" in type(m).__name__}))
"""


@pytest.fixture(scope="module")
def scenarios() -> dict[str, str]:
    """name -> its DRAFT and MODULE lines ("target" -> the target built after the draft scenario)."""
    code = PRELUDE
    for name, flag, scope, kernels in SCENARIOS:
        code += SCENARIO.format(name=name, flag=flag, scope=scope, kernels=kernels)
        if name == "draft":
            code += AFTER_DRAFT
    out: dict[str, str] = {}
    for line in _run(textwrap.dedent(code)).splitlines():
        key = "target" if line.startswith("TARGET") else line.split(" ", 1)[0]
        out[key] = out.get(key, "") + line + "\n"
    return out


def test_scope_all_leaves_the_patch_for_the_target(scenarios):
    assert "all MODULE LigerRMSNorm LigerSwiGLUMLP" in scenarios["all"]


def test_baseline_draft_has_stock_modules(scenarios):
    assert "baseline DRAFT ['Qwen3MLP', 'Qwen3RMSNorm']" in scenarios["baseline"]


def test_target_built_after_the_draft_keeps_stock_modules(scenarios):
    assert "draft DRAFT ['LigerRMSNorm', 'LigerSwiGLUMLP']" in scenarios["draft"]
    assert "TARGET ['Qwen3MLP', 'Qwen3RMSNorm']" in scenarios["target"]


def test_missing_liger_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(liger, "liger_version", lambda: None)
    with pytest.raises(ConfigError, match=r"liger-kernel is not installed \(pip install '\.\[liger\]'\)"):
        with liger.liger_patch(True):
            pass


def test_old_liger_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(liger, "liger_version", lambda: "0.3.1")
    with pytest.raises(ConfigError, match=r"0\.3\.1 is too old, need >= 0\.6\.0"):
        with liger.liger_patch(True):
            pass


def test_broken_liger_import_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", None)  # import raises ImportError
    with pytest.raises(ConfigError, match="cannot import apply_liger_kernel_to_qwen3"):
        with liger.liger_patch(True):
            pass


def test_a_liger_built_for_another_transformers_says_so(monkeypatch):
    """liger-kernel 0.6.4 under transformers 5.x (seen on the H100, results/h100-liger-versions):
    its Qwen3 entry point imports a name transformers no longer has; installing liger-kernel again
    would not help, so the error does not say to."""
    import transformers

    class OldLiger(types.ModuleType):
        def __getattr__(self, name):
            raise ImportError(
                "cannot import name 'HybridCache' from 'transformers.cache_utils'",
                name="transformers.cache_utils",
            )

    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", OldLiger("liger_kernel.transformers"))
    with pytest.raises(ConfigError) as e:
        with liger.liger_patch(True):
            pass
    assert "HybridCache" in str(e.value)
    assert f"not built for transformers {transformers.__version__}" in str(e.value)
    assert "pip install" not in str(e.value)


def test_fused_linear_ce_checks_name_their_key(monkeypatch):
    monkeypatch.setattr(liger, "liger_version", lambda: None)
    with pytest.raises(ConfigError, match=r"^model\.liger_fused_linear_ce: liger-kernel is not installed"):
        liger.fused_linear_ce_fn()
    monkeypatch.setattr(liger, "liger_version", lambda: "0.8.5")
    monkeypatch.setattr(liger, "check_triton", lambda: None)
    functional = pytest.importorskip("liger_kernel.transformers.functional")
    monkeypatch.setattr(
        functional, "liger_fused_linear_cross_entropy", lambda input, weight, target, reduction="mean": 0
    )
    with pytest.raises(ConfigError, match="has no return_token_accuracy; upgrade liger-kernel"):
        liger.fused_linear_ce_fn()
    # a version whose per-token backward is wrong (no token_grad_output) is refused, not used
    monkeypatch.setattr(
        functional,
        "liger_fused_linear_cross_entropy",
        lambda input, weight, target, return_token_accuracy=False: 0,
    )
    ops = pytest.importorskip("liger_kernel.ops.fused_linear_cross_entropy")
    monkeypatch.setattr(
        ops, "fused_linear_cross_entropy_forward", lambda _input, weight, target, reduction="mean": 0
    )
    with pytest.raises(ConfigError, match="cannot weight per-token losses in its backward"):
        liger.fused_linear_ce_fn()


# -- Triton: one distribution of the `triton` module, the one torch uses -------------------


def _providers(
    monkeypatch, providers: dict[str, list[str]], versions: dict[str, str], torch_requires: list[str]
):
    monkeypatch.setattr(liger.metadata, "packages_distributions", lambda: providers)
    real_version = liger.metadata.version
    monkeypatch.setattr(liger.metadata, "version", lambda name: versions.get(name) or real_version(name))
    monkeypatch.setattr(liger.metadata, "requires", lambda name: torch_requires if name == "torch" else [])


ROCM_TORCH_REQUIRES = ['pytorch-triton-rocm==3.5.1; platform_system == "Linux"', "filelock"]


def test_rocm_torch_with_a_second_triton_is_refused(monkeypatch):
    # liger-kernel's `triton>=2.3.1` made pip add CUDA's triton beside ROCm's.
    _providers(
        monkeypatch,
        {"triton": ["pytorch-triton-rocm", "triton"]},
        {"pytorch-triton-rocm": "3.5.1", "triton": "3.5.1"},
        ROCM_TORCH_REQUIRES,
    )
    assert liger.triton_providers() == {"pytorch-triton-rocm": "3.5.1", "triton": "3.5.1"}
    with pytest.raises(ConfigError) as exc:
        with liger.liger_patch(True):
            pass
    msg = str(exc.value)
    assert "\n" not in msg
    assert "pytorch-triton-rocm 3.5.1 (torch's), triton 3.5.1" in msg
    assert (
        "Fix: pip uninstall triton, then pip install --force-reinstall --no-deps pytorch-triton-rocm==3.5.1"
        in msg
    )


def test_single_triton_passes(monkeypatch):
    """One distribution of the `triton` module (its name spelled with underscores, or listed twice),
    or none: one provider at most is found, and the check refuses nothing."""
    _providers(
        monkeypatch,
        {"triton": ["pytorch_triton_rocm"]},
        {"pytorch_triton_rocm": "3.5.1"},
        ROCM_TORCH_REQUIRES,
    )
    assert liger.triton_providers() == {"pytorch-triton-rocm": "3.5.1"}
    assert liger.check_triton() is None
    _providers(
        monkeypatch,
        {"triton": ["triton", "triton"]},
        {"triton": "3.6.0"},
        ['triton==3.6.0; platform_system == "Linux"'],
    )
    assert liger.triton_providers() == {"triton": "3.6.0"}  # one distribution listed twice
    assert liger.check_triton() is None
    _providers(monkeypatch, {}, {}, [])
    assert liger.triton_providers() == {}
    assert liger.check_triton() is None
    # the same check with a second provider beside it refuses (the contrast that makes the above mean it)
    _providers(monkeypatch, {"triton": ["triton", "pytorch_triton_rocm"]},
               {"triton": "3.6.0", "pytorch_triton_rocm": "3.5.1"}, ROCM_TORCH_REQUIRES)  # fmt: skip
    with pytest.raises(ConfigError, match="2 distributions provide the `triton` module"):
        liger.check_triton()


def test_unknown_torch_requirement_still_names_the_stray(monkeypatch):
    _providers(
        monkeypatch,
        {"triton": ["triton", "pytorch-triton-rocm"]},
        {"pytorch-triton-rocm": "3.4.0", "triton": "3.5.0"},
        [],  # a source build of torch names no Triton
    )
    with pytest.raises(ConfigError, match=r"pip uninstall triton, then .*pytorch-triton-rocm==3\.4\.0"):
        liger.check_triton()


def test_triton_providers_reads_installed_metadata(tmp_path, monkeypatch):
    for dist, version in (("pytorch_triton_rocm", "3.5.1"), ("triton", "3.5.1")):
        info = tmp_path / f"{dist}-{version}.dist-info"
        info.mkdir()
        name = dist.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "top_level.txt").write_text("triton\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    providers = liger.triton_providers()
    assert {"pytorch-triton-rocm", "triton"} <= set(providers)
    assert providers["pytorch-triton-rocm"] == "3.5.1"


def test_missing_liger_on_rocm_says_no_deps(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "torch", types.SimpleNamespace(version=types.SimpleNamespace(hip="7.2.0"))
    )
    monkeypatch.setattr(liger, "liger_version", lambda: None)
    with pytest.raises(ConfigError, match=r"not installed \(pip install --no-deps 'liger-kernel>=0\.6\.0'\)"):
        liger._load_patch_fn()


@pytest.mark.parametrize(
    ("arm", "expected"),
    [("rmsnorm", "['LigerRMSNorm', 'Qwen3MLP']"), ("swiglu", "['LigerSwiGLUMLP', 'Qwen3RMSNorm']")],
)
def test_one_kernel_alone_lands_and_the_other_stays_stock(scenarios, arm, expected):
    """The rmsnorm and swiglu arms: which of the two kernels buys the gain."""
    assert (
        f"{arm} DRAFT {expected}" in scenarios[arm]
        and f"{arm} MODULE Qwen3RMSNorm Qwen3MLP" in scenarios[arm]
    )
