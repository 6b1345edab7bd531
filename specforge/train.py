"""The DFlash training loop (single device, or FSDP2 under torchrun).

Precision: the draft holds bf16 parameters and computes in bf16 (no autocast); the
optimizer keeps fp32 master weights, fp32 gradients accumulated over micro-batches, and
AdamW state, then copies the updated masters back into the bf16 parameters.

Determinism across arms: weights come from a seeded init that does not depend on module
classes; data order from a seeded sampler; anchors from a generator re-seeded for every
micro-batch from (seed, micro-batch index, rank). So the baseline and Liger arms see the
same weights, data and anchors, and their losses can be compared step by step.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import data as data_mod
from . import flops, objective, profiling, provenance, teardown
from . import target as target_mod
from .config import ConfigError, Profile, TrainConfig, resolved_values
from .draft import DFlashDraft
from .liger import fused_linear_ce_fn, liger_patch, liger_version
from .runfiles import RunFiles, one_line, oom_reason, write_json_atomic

GIB = 2**30
EXIT_OOM = 3
IMPORTED_AT = time.time()  # torch, transformers and the trainer's modules are imported by now


@dataclass
class Env:
    device: torch.device
    rank: int
    world: int
    local_rank: int


def resolve_env(cfg: TrainConfig) -> Env:
    """Pick the device and check the config can run here (before anything is written)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    want = cfg.training.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device: cuda requested but no CUDA or ROCm GPU is visible")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if device.type == "cpu":
        if cfg.model.use_liger_kernel:
            raise ConfigError(
                "model.use_liger_kernel: Liger's Triton kernels need a CUDA or ROCm GPU; none here"
            )
        if cfg.model.attention_backend == "flex_attention":
            raise ConfigError("model.attention_backend: flex_attention has no backward on the CPU; use sdpa")
        if cfg.model.compile_layers:
            raise ConfigError(
                "model.compile_layers: compiling the draft's layers is a GPU arm (TorchInductor's "
                "Triton kernels); on the CPU leave it false"
            )
        if cfg.model.liger_fused_linear_ce:
            raise ConfigError(
                "model.liger_fused_linear_ce: Liger's fused linear cross-entropy is a Triton kernel "
                "and needs a CUDA or ROCm GPU; on the CPU leave it false"
            )
    return Env(device=device, rank=rank, world=world, local_rank=local_rank)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up then cosine decay to min_lr_ratio * lr (step is 0-based)."""
    tr, lr = cfg.training, cfg.training.lr * cfg.training.lr_scale
    if step < tr.lr_warmup_steps:
        return lr * (step + 1) / tr.lr_warmup_steps
    span = max(1, tr.steps - tr.lr_warmup_steps)
    progress = min(1.0, (step - tr.lr_warmup_steps) / span)
    return lr * (tr.min_lr_ratio + (1 - tr.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer_impl(cfg: TrainConfig, env: Env) -> str:
    """Which AdamW implementation runs: fused (a GPU), foreach (multi-tensor) or the plain loop."""
    if env.device.type == "cuda" and cfg.training.fused_adamw:
        return "fused"
    return "foreach" if cfg.training.foreach_adamw else "for-loop"


def param_checksum(model: torch.nn.Module) -> str:
    """A cheap fingerprint of the initial weights (equal across arms when init is equal)."""
    total = torch.zeros((), dtype=torch.float64, device=next(model.parameters()).device)
    for i, (_, p) in enumerate(sorted(model.named_parameters())):
        total += (i + 1) * p.detach().double().abs().sum() + p.detach().double().sum()
    return f"{total.item():.12e}"


class Trainer:
    def __init__(self, cfg: TrainConfig, profile: Profile, env: Env, dataset):
        self.cfg, self.profile, self.env = cfg, profile, env
        self.dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
        self.target = None
        self.arch_t, self.arch_d = profile.target, profile.draft
        max_pos = cfg.data.seq_len + profile.draft.block_size + 1
        seed = cfg.training.seed
        if cfg.mode == "online":
            self.target = target_mod.build_target(
                self.arch_t, cfg.target, env.device, self.dtype, seed, max_pos
            )
            self.head = target_mod.head_of(self.target)
        else:
            embed, lm_head = data_mod.load_head(cfg.data.cache_dir, env.device)
            self.head = target_mod.FrozenHead(embed.to(self.dtype), lm_head.to(self.dtype))
        m = cfg.model
        if m.liger_fused_linear_ce:
            fused_linear_ce_fn()  # a missing or too old liger-kernel is a one-line error now, not at step 1
        with (
            liger_patch(m.use_liger_kernel, m.liger_scope, m.liger_rms_norm, m.liger_swiglu),
            torch.device(env.device),
        ):
            draft = DFlashDraft(
                profile.draft, len(self.arch_t.capture_layer_ids), self.arch_t.hidden_size, max_pos
            )
        draft.to(self.dtype)
        draft.init_weights(seed, nudge_ulp=m.init_perturb_ulp)  # nudged: aa_eps, parity's sensitivity floor
        self.checksum = param_checksum(draft)
        self.module_types = sorted({type(m).__name__ for m in draft.modules()})
        if cfg.model.compile_layers:  # in place, so parameter names and FSDP wrapping stay as they are
            for layer in draft.layers:
                layer.compile()
        if env.world > 1:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(reduce_dtype=torch.float32)
            for layer in draft.layers:
                fully_shard(layer, mp_policy=mp)
            fully_shard(draft, mp_policy=mp)
        self.draft = draft
        self.params = [p for p in draft.parameters() if p.requires_grad]
        self.masters = [p.detach().float() for p in self.params]
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        fused = env.device.type == "cuda" and cfg.training.fused_adamw
        self.opt = torch.optim.AdamW(
            self.masters,
            lr=cfg.training.lr * cfg.training.lr_scale,
            betas=(0.9, 0.95),
            weight_decay=cfg.training.weight_decay,
            fused=fused,
            foreach=None if fused else cfg.training.foreach_adamw,
        )
        self.loader = data_mod.make_loader(
            dataset,
            cfg.training.batch_size,
            cfg.data.seed,
            cfg.data.num_workers,
            env.rank,
            env.world,
            pin=env.device.type == "cuda",
        )
        self.anchor_gen = torch.Generator(device=env.device)

    def sync(self) -> None:
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)

    def micro_step(self, batch: dict, micro_index: int):
        """Forward + backward of one micro-batch; returns (loss, accuracy, counts) as tensors."""
        cfg, dev = self.cfg, self.env.device
        ids = batch["input_ids"].to(dev, non_blocking=True).long()
        lmask = batch["loss_mask"].to(dev, non_blocking=True)
        if self.target is not None:
            hidden = target_mod.capture_hidden(self.target, ids, self.arch_t.capture_layer_ids)
        else:
            hidden = batch["hidden_states"].to(dev, non_blocking=True).to(self.dtype)
        self.anchor_gen.manual_seed(
            cfg.training.seed * 1_000_003 + micro_index * self.env.world + self.env.rank
        )
        anchors, keep = objective.sample_anchors(lmask, cfg.training.num_anchors, self.anchor_gen)
        blocks = objective.make_blocks(
            ids,
            lmask,
            anchors,
            keep,
            self.arch_d.block_size,
            self.arch_d.mask_token_id,
            cfg.training.loss_decay_gamma,
        )
        out = self.draft(
            hidden, self.head.embed_tokens(blocks.noise_ids), anchors, keep, cfg.model.attention_backend
        )
        loss, acc, scored = objective.decayed_ce(
            out, self.head.lm_head, blocks, cfg.model.loss_chunk_size, cfg.model.liger_fused_linear_ce
        )
        (loss / cfg.training.accumulation_steps).backward()
        for p, m in zip(self.params, self.masters):
            if p.grad is not None:
                m.grad.add_(p.grad)
                p.grad = None
        eff = torch.where(keep, anchors, torch.zeros_like(anchors))
        pairs = (keep * (eff + self.arch_d.block_size)).sum() * self.arch_d.block_size
        counts = torch.stack(
            [keep.sum().double(), torch.tensor(float(scored), device=dev).double(), pairs.double()]
        )
        return loss.detach(), acc.detach(), counts

    def optimizer_step(self, step: int) -> float:
        tr = self.cfg.training
        if tr.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.masters, tr.max_grad_norm)
        else:
            norm = torch.nn.utils.get_total_norm([m.grad for m in self.masters])
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        lr = lr_at(step, self.cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
                m.grad.zero_()
        return norm

    def step_flops(self, counts: torch.Tensor) -> float:
        """Model FLOPs of one optimizer step, from this rank's block counts, over all ranks."""
        blocks, scored, pairs = counts.tolist()
        s, n = self.cfg.data.seq_len, self.cfg.training.batch_size * self.cfg.training.accumulation_steps
        per_rank = flops.draft_flops(self.profile, s, blocks / n, scored / n, pairs / n) * n
        if self.target is not None:
            per_rank += flops.target_flops(self.profile, s) * n
        return per_rank * self.env.world


def make_dataset(cfg: TrainConfig, profile: Profile):
    if cfg.mode == "offline":
        if not cfg.data.cache_dir:
            raise ConfigError(
                "data.cache_dir: offline mode needs a prepared cache (python -m specforge prepare)"
            )
        return data_mod.cache_dataset(cfg.data, profile)
    return data_mod.TokenDataset(cfg.data, profile)


def _reduce(t: torch.Tensor, op) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t


def _peak_memory(device: torch.device) -> tuple:
    """The allocator's peaks so far (GiB) and its health: how often it freed its cache to retry an
    allocation (slow steps, a near-OOM) and the OOMs it caught; max over ranks; None on the CPU."""
    if device.type != "cuda":
        return None, None, None, None
    stats = torch.cuda.memory_stats(device)
    peak_gib = [torch.cuda.max_memory_allocated(device) / GIB, torch.cuda.max_memory_reserved(device) / GIB]
    counts = [float(stats.get("num_alloc_retries", 0)), float(stats.get("num_ooms", 0))]
    peaks = torch.tensor(peak_gib + counts, device=device)
    alloc, reserved, retries, ooms = _reduce(peaks, dist.ReduceOp.MAX).tolist()
    return alloc, reserved, int(retries), int(ooms)


def _compile_times() -> dict[str, float]:
    """Seconds TorchDynamo/Inductor spent per compile phase so far ({} when torch does not say)."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        return {k: round(float(v), 2) for k, v in calculate_time_spent().items()}
    except Exception:
        return {}


class _FirstStep:
    """Phases of the first step, each up to a device sync: the data, the first micro-batch's
    forward and backward (with any compiling), the other micro-batches, the optimizer."""

    def __init__(self, sync, t0: float):
        self.sync, self.last, self.phases = sync, t0, {}

    def mark(self, name: str) -> None:
        if name in self.phases:
            return
        self.sync()
        now = time.perf_counter()
        self.phases[name] = round(now - self.last, 3)
        self.last = now


def run(
    cfg: TrainConfig,
    profile: Profile,
    out_dir: Path,
    started: float | None = None,
    force: bool = False,
    set_keys: list[str] | None = None,
) -> int:
    """Train, writing the run contract's files into out_dir. Returns the process exit code.
    (``set_keys``: the command line's keys, whose resolved values run.json's set_resolved holds.)

    Everything that can refuse the run (ConfigError: exit 2, nothing written) is checked
    before the first write: the machine, the data or cache, a batch the data can fill. Only
    then does --force (``force``) remove the finished run's files it replaces.
    """
    env = resolve_env(cfg)
    t_data = time.perf_counter()
    dataset = make_dataset(cfg, profile)  # bad data or cache: a ConfigError before anything is written
    data_mod.check_batch(len(dataset), cfg.training.batch_size, env.world)
    started = started or time.time()
    phases = {  # a run forked from a warm server (bench/procs/forkstart.py) imported before it started
        "imports_s": round(max(0.0, IMPORTED_AT - started), 2),
        "imports_preloaded": IMPORTED_AT < started,
        "dataset_s": round(time.perf_counter() - t_data, 2),
    }
    if env.world > 1 and not dist.is_initialized():
        if env.device.type == "cuda":
            torch.cuda.set_device(env.device)
        dist.init_process_group(backend="nccl" if env.device.type == "cuda" else "gloo")
    files = RunFiles(out_dir, enabled=env.rank == 0)
    if force:
        files.clear()  # rank 0 only: the other ranks write nothing
    arm = "liger" if cfg.model.use_liger_kernel else "baseline"
    prov = provenance.collect() if env.rank == 0 else {}  # only rank 0 writes run.json
    device_name = torch.cuda.get_device_name(env.device) if env.device.type == "cuda" else None
    peak = cfg.training.peak_tflops or flops.peak_tflops(device_name)
    m = cfg.model
    files.start(
        {
            "arm": arm,
            "world_size": env.world,
            "config": cfg.to_dict(),
            "profile": {"name": profile.name},
            "liger": {
                "enabled": cfg.model.use_liger_kernel,
                "scope": cfg.model.liger_scope,
                "kernels": [k for k, on in (("rms_norm", m.liger_rms_norm), ("swiglu", m.liger_swiglu)) if on]
                if m.use_liger_kernel
                else [],
                "version": liger_version(),
            },
            "objective": objective.OBJECTIVE.format(chunk=cfg.model.loss_chunk_size),
            "precision": f"{cfg.model.dtype} params and compute; fp32 master weights, grads and AdamW state",
            "optimizer": f"AdamW, {optimizer_impl(cfg, env)}",
            "peak_tflops": peak,
            "provenance": prov,
            "startup": phases,
            "set_resolved": resolved_values(cfg, set_keys or []),
        }
    )
    try:
        return _train(cfg, profile, env, files, peak, started, dataset)
    except ConfigError:  # found only once running (e.g. a target directory that fails to load)
        files.discard()  # exit 2 promises nothing written: take back exactly what this run wrote
        raise
    except torch.OutOfMemoryError as e:
        files.finish("oom", oom_reason(e))  # the allocator's first sentence; the whole message below
        print(f"out of memory: {one_line(e)}", file=sys.stderr, flush=True)
        return EXIT_OOM
    except KeyboardInterrupt:
        files.finish("error", "interrupted")
        return 130
    except Exception as e:
        files.finish("error", one_line(e))
        traceback.print_exc()
        return 1
    finally:
        teardown.destroy_process_group()


def _train(
    cfg: TrainConfig, profile: Profile, env: Env, files: RunFiles, peak: float | None, started: float, dataset
) -> int:
    tr = cfg.training
    t_start = time.perf_counter()
    torch.manual_seed(tr.seed)
    trainer = Trainer(cfg, profile, env, dataset)
    startup = {**files.record.get("startup", {}), "build_s": round(time.perf_counter() - t_start, 2)}
    files.update(param_checksum=trainer.checksum, draft_module_types=trainer.module_types, startup=startup)
    log = print if env.rank == 0 else (lambda *a, **k: None)
    log(
        f"[specforge] {profile.name} {cfg.mode} arm={'liger' if cfg.model.use_liger_kernel else 'baseline'} "
        f"device={env.device} world={env.world} backend={cfg.model.attention_backend} "
        f"setup {time.perf_counter() - t_start:.1f}s",
        flush=True,
    )
    samples = tr.batch_size * tr.accumulation_steps * env.world
    flops_sum, flops_n = 0.0, 0
    profile_events: list[tuple[str, float]] = []  # (kernel or op name, µs) of training.profile_steps
    for step in range(tr.steps):
        trainer.sync()
        t0 = time.perf_counter()
        if step == 0:  # process start -> first training step: imports, model build, data workers
            startup_s = time.time() - started
            startup["to_first_step_s"] = round(startup_s, 2)
            files.update(startup_s=round(startup_s, 2), startup=startup)
            log(f"[specforge] first step starts {startup_s:.1f}s after process start", flush=True)
        losses, accs = [], []
        counts = torch.zeros(3, dtype=torch.float64, device=env.device)
        first = _FirstStep(trainer.sync, t0) if step == 0 else None  # where step 1's time goes
        profiled = step + 1 in tr.profile_steps
        with profiling.profiler(env.device.type) if profiled else contextlib.nullcontext() as prof:
            for micro in range(tr.accumulation_steps):
                batch = next(trainer.loader)
                if first:
                    first.mark("first_batch_s")
                loss, acc, c = trainer.micro_step(batch, step * tr.accumulation_steps + micro)
                losses.append(loss)
                accs.append(acc)
                counts += c
                if first and micro == 0:
                    first.mark("first_micro_step_s")  # forward + backward, compiling on a cold cache
            if first:
                first.mark("other_micro_steps_s")
            grad_norm = trainer.optimizer_step(step)
            trainer.sync()
        dt = time.perf_counter() - t0  # a profiled step's includes the profiler's overhead and teardown
        if profiled:
            profile_events += profiling.events(prof, env.device.type)
        if first:  # step 1's phases, and what it spent compiling (TorchDynamo/Inductor), best effort
            first.mark("optimizer_s")
            startup.update(first_step_s=round(dt, 2), first_step=first.phases, compile_s=_compile_times())
            files.update(startup=startup)
        stats = torch.stack([torch.stack(losses).mean().float(), torch.stack(accs).mean().float()])
        stats = _reduce(stats, dist.ReduceOp.SUM) / env.world
        step_flops = trainer.step_flops(counts)
        flops_sum, flops_n = flops_sum + step_flops, flops_n + 1
        row = _step_row(cfg, env, step, stats, dt, samples, float(grad_norm), step_flops, peak, started)
        if profiled:  # only then: an unprofiled run's rows are exactly as before
            row["profiled"] = True
        files.step(row)
        if (step + 1) % tr.log_every == 0 or step + 1 == tr.steps:
            log(_step_line(row, tr.steps), flush=True)
    if tr.profile_steps:
        gpu = env.device.type == "cuda"
        name = torch.cuda.get_device_name(env.device) if gpu else "cpu"
        record = profiling.profile_record(
            profile_events, sorted(tr.profile_steps), name, cfg.model.use_liger_kernel
        )
        if files.enabled:
            write_json_atomic(files.dir / "profile.json", record)
    files.finish("ok", None, model_flops_per_step=flops_sum / max(1, flops_n))
    return 0


def _step_row(
    cfg: TrainConfig,
    env: Env,
    step: int,
    stats,
    dt: float,
    samples: int,
    grad_norm: float,
    step_flops: float,
    peak: float | None,
    started: float,
) -> dict:
    """One optimizer step's metrics.jsonl row (docs/run-contract.md)."""
    alloc, reserved, retries, ooms = _peak_memory(env.device)
    return {
        "step": step + 1,
        "loss": stats[0].item(),
        "accuracy": stats[1].item(),
        "step_time_s": dt,
        "samples": samples,
        "tokens": samples * cfg.data.seq_len,
        "samples_per_s": samples / dt,
        "tokens_per_s": samples * cfg.data.seq_len / dt,
        "lr": lr_at(step, cfg),
        "grad_norm": grad_norm,
        "torch_peak_allocated_gib": alloc,
        "torch_peak_reserved_gib": reserved,
        "alloc_retries": retries,  # cumulative since the process started
        "alloc_ooms": ooms,
        "model_tflops": step_flops / 1e12,
        "mfu": step_flops / dt / (peak * 1e12 * env.world) if peak else None,
        "elapsed_s": round(time.time() - started, 3),  # process start -> end of this step
        "time": round(time.time(), 3),  # wall clock at the end of this step (matches the poller's t)
    }


def _step_line(row: dict, steps: int) -> str:
    """The step's line on stdout."""
    mfu = f" | mfu {row['mfu'] * 100:.1f}%" if row["mfu"] is not None else ""
    alloc, reserved = row["torch_peak_allocated_gib"], row["torch_peak_reserved_gib"]
    mem = f" | mem {alloc:.2f}/{reserved:.2f} GiB" if alloc is not None else ""
    return (
        f"step {row['step']}/{steps} | loss {row['loss']:.4f} | acc {row['accuracy']:.3f} | "
        f"{row['step_time_s']:.3f} s/step | {row['samples_per_s']:.2f} samples/s{mem}{mfu}"
    )
