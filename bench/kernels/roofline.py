"""Bytes, FLOPs and the roofline of the modules the Liger arms swap (pure arithmetic, no torch).

The byte counts are the *compulsory* traffic of forward + backward: every tensor the module's
forward and backward must read or write, counted once, with ``e`` bytes per element of the
training dtype (the weights and their gradients are in that dtype too, as in the trainer).
They are the same for the stock and the Liger implementation of a module: how close each comes
to them is what the roofline fraction shows. (The stock RMSNorm moves more than this: it makes
fp32 copies of its input and several temporaries, each a trip through memory; fusing them away
is what Liger's kernel is for.) docs/kernels.md writes the same formulas out.

RMSNorm over ``rows`` rows of width ``dim`` (E = rows x dim elements):

    y = w * x * r,  r = 1 / sqrt(mean(x^2) + eps)
    bytes = e * (5 E + 3 dim)
        forward:  read x (E), read w (dim), write y (E)
        backward: read dy (E), read x (E), read w (dim), write dx (E), write dw (dim)
        (the per-row r is left out: one number per row, and it can be recomputed from x)
    FLOPs = 13 E
        forward 4 E:  x^2, the row sum, x * r, * w
        backward 9 E: x_hat = x * r again (1), dw += dy * x_hat (2), g = dy * w (1),
                      c = row sum of g * x_hat (2), dx = r * (g - x_hat * c) (3)

SwiGLU MLP over T tokens, hidden size H, intermediate size I (three GEMMs, bias-free):

    y = down(silu(gate(x)) * up(x))
    FLOPs = 18 T H I
        forward: three GEMMs of 2 T H I; backward: for each, an input-gradient and a
        weight-gradient GEMM of the same size (2 x forward). The SiLU * up element-wise work,
        O(T I), is left out (a fraction of about 1/H of the GEMMs').
    bytes = e * (8 T H + 9 H I + 17 T I)
        The three GEMMs run as separate kernels in both implementations (Liger fuses only the
        activation), each reading its operands and writing its result once; the activation is
        counted as one fused pass (the minimum):
        forward:  gate and up GEMMs read x twice (2 TH) and the weights (2 HI), write g, u (2 TI);
                  silu(g) * u reads g, u (2 TI), writes a (TI); the down GEMM reads a (TI) and
                  its weight (HI), writes y (TH)                       -> 3 TH + 3 HI + 6 TI
        backward: down: da = dy Wd reads dy (TH), Wd (HI), writes da (TI); dWd = dy^T a reads
                  dy (TH), a (TI), writes dWd (HI). Activation: reads da, g, u (3 TI), writes
                  dg, du (2 TI). Gate/up: dx = dg Wg + du Wu reads dg, du (2 TI), Wg, Wu
                  (2 HI), writes dx once (TH); dWg, dWu read dg, du (2 TI) and x twice (2 TH),
                  write 2 HI                                            -> 5 TH + 6 HI + 11 TI

Roofline (Williams et al. 2009): a kernel cannot run faster than
``max(bytes / copy bandwidth, FLOPs / matmul rate)`` with the device's measured limits. The
larger term names what bounds it (memory or compute); the fraction of the roofline is that
bound divided by the measured time (1.0 = at the limit). Element-wise FLOPs run on the vector
units, not the tensor cores whose rate the matmul measures; at an RMSNorm's intensity (about
1 FLOP per byte in bf16) it is memory-bound by any of these rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}") from None


def rmsnorm_bytes(rows: int, dim: int, elem_bytes: int) -> int:
    """Compulsory bytes of one RMSNorm forward + backward: e (5 rows dim + 3 dim)."""
    return elem_bytes * (5 * rows * dim + 3 * dim)


def rmsnorm_flops(rows: int, dim: int) -> int:
    """FLOPs of one RMSNorm forward (4 per element) + backward (9 per element)."""
    return 13 * rows * dim


def mlp_bytes(tokens: int, hidden: int, intermediate: int, elem_bytes: int) -> int:
    """Compulsory bytes of one SwiGLU MLP forward + backward: e (8 T H + 9 H I + 17 T I)."""
    t, h, i = tokens, hidden, intermediate
    return elem_bytes * (8 * t * h + 9 * h * i + 17 * t * i)


def mlp_flops(tokens: int, hidden: int, intermediate: int) -> int:
    """GEMM FLOPs of one SwiGLU MLP forward (6 T H I) + backward (12 T H I)."""
    return 18 * tokens * hidden * intermediate


def linear_ce_bytes(tokens: int, hidden: int, vocab: int, elem_bytes: int) -> int:
    """Compulsory bytes of the LM head + cross-entropy forward + backward with the logits never
    stored whole (chunked or fused), the head frozen: the head read twice (logits, then dX), X read
    and dX written, e (2 V H + 2 T H), plus 12 T for the labels (int64) and weights (fp32)."""
    return elem_bytes * (2 * vocab * hidden + 2 * tokens * hidden) + 12 * tokens


def linear_ce_flops(tokens: int, hidden: int, vocab: int) -> int:
    """GEMM FLOPs of the LM head + CE forward (logits, 2 T H V) and backward (dX, 2 T V H); the
    frozen head gets no gradient."""
    return 4 * tokens * hidden * vocab


@dataclass(frozen=True)
class Roofline:
    bound: str  # "memory" or "compute": the larger of the two lower bounds
    floor_s: float  # max(bytes / bandwidth, flops / rate): the fastest the module could run
    fraction: float  # floor_s / measured time (1.0 = at the roofline); nan without a time
    achieved_bytes_per_s: float
    achieved_flops_per_s: float
    intensity: float  # FLOPs per byte


def roofline(
    flops: float, nbytes: float, seconds: float | None, bytes_per_s: float, flops_per_s: float
) -> Roofline:
    """Where a module stands against the device's measured limits (bandwidth in B/s, rate in FLOP/s)."""
    if bytes_per_s <= 0 or flops_per_s <= 0:
        raise ValueError("device limits must be positive")
    t_mem, t_compute = nbytes / bytes_per_s, flops / flops_per_s
    floor = max(t_mem, t_compute)
    timed = seconds is not None and seconds > 0 and math.isfinite(seconds)
    return Roofline(
        bound="memory" if t_mem >= t_compute else "compute",
        floor_s=floor,
        fraction=floor / seconds if timed else math.nan,
        achieved_bytes_per_s=nbytes / seconds if timed else math.nan,
        achieved_flops_per_s=flops / seconds if timed else math.nan,
        intensity=flops / nbytes if nbytes else math.inf,
    )


def step_saving_s(stock_s: float, liger_s: float, per_micro_batch: int, micro_batches_per_step: int) -> float:
    """What swapping one module predicts for one optimizer step: the per-call saving times the
    calls per micro-batch times the micro-batches per step (negative: Liger is slower)."""
    return (stock_s - liger_s) * per_micro_batch * micro_batches_per_step


def samples_per_s_delta_pct(base_step_s: float, saving_s: float) -> float:
    """Δ samples/s (%) when a step of ``base_step_s`` gets ``saving_s`` shorter (same samples per step)."""
    if (
        not (math.isfinite(base_step_s) and math.isfinite(saving_s))
        or base_step_s <= 0
        or saving_s >= base_step_s
    ):
        return math.nan
    return (base_step_s / (base_step_s - saving_s) - 1.0) * 100.0
