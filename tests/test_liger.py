"""The Liger patch really lands in the draft, whatever the import order, and only there."""

import subprocess
import sys
import textwrap

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


def test_scope_all_leaves_the_patch_for_the_target():
    out = _run(textwrap.dedent(BUILD.format(scope="all")))
    assert "MODULE LigerRMSNorm LigerSwiGLUMLP" in out


def test_baseline_draft_has_stock_modules():
    out = _run(textwrap.dedent(BUILD.replace("liger_patch(True", "liger_patch(False").format(scope="draft")))
    assert "DRAFT ['Qwen3MLP', 'Qwen3RMSNorm']" in out


def test_target_built_after_the_draft_keeps_stock_modules():
    code = textwrap.dedent(BUILD.format(scope="draft")) + textwrap.dedent(
        """
        from specforge.target import build_target
        from specforge.config import TargetConfig
        t = build_target(p.target, TargetConfig(), torch.device("cpu"), torch.float32, 0, 256)
        print("TARGET", sorted({type(m).__name__ for m in t.modules() if "Norm" in type(m).__name__ or "MLP" in type(m).__name__}))
        """
    )
    assert "TARGET ['Qwen3MLP', 'Qwen3RMSNorm']" in _run(code)


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
