"""Our embedded DFlash trainer (``specforge/``) as a plug: the run contract, the packages it
imports, and what the warm fork server preloads for it."""

from __future__ import annotations

from bench.trainers.contract import ContractPlug

EMBEDDED = ContractPlug(
    module="specforge",
    packages=("torch", "transformers", "safetensors"),
    imports=("specforge.train",),  # the training module and its heavy imports
    gpu_preload=("liger_kernel.transformers", "torch._inductor.compile_fx"),
    name="embedded",
)
