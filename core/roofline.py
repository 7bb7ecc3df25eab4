"""The five numbers of the part0 series (the document this project starts from): what any engine can and cannot do on a GPU, before a line is written.

From a model config and a GPU spec: weight bytes, the batch-1 decode ceiling, KV bytes per token,
the ridge point, and how many token positions (and full requests) fit in the memory left for the
cache. Torch-free: the simulator's roofline cost model reads the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.config import ModelConfig

GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    """A GPU as the roofline sees it.

    bandwidth_gbs: memory bandwidth, GB/s (10^9 bytes).
    fp16_tflops: dense fp16/bf16 matrix rate, TFLOP/s.
    memory_gb: memory on the card, GB (10^9 bytes, as spec sheets give it).
    free_gib: memory left for the KV cache after the model is loaded, GiB, when measured on the
        card; None means "estimate it" (see `free_for_cache_gib`).
    source: where the figures come from.
    """

    name: str
    bandwidth_gbs: float
    fp16_tflops: float
    memory_gb: float
    free_gib: float | None = None
    source: str = "datasheet"

    def floor_s(self, nbytes: float, flops: float = 0.0) -> float:
        """The roofline's time for work that moves `nbytes` and does `flops`: the larger of the
        two at the card's rates."""
        return max(nbytes / (self.bandwidth_gbs * 1e9), flops / (self.fp16_tflops * 1e12))

    @property
    def ridge_flop_per_byte(self) -> float:
        """FLOPs per byte above which work is compute-bound on this card."""
        return self.fp16_tflops * 1e12 / (self.bandwidth_gbs * 1e9)


GPUS: dict[str, GPUSpec] = {
    # The part0 series' card; 19 GiB free is what it measured after loading the model.
    "a10": GPUSpec("NVIDIA A10", 600, 125, 24, free_gib=19, source="datasheet; free memory measured in the part0 series"),
    "a10g": GPUSpec("NVIDIA A10G", 600, 125, 24, source="datasheet"),
    "l4": GPUSpec("NVIDIA L4", 300, 121, 24, source="datasheet"),
    "a100-80gb": GPUSpec("NVIDIA A100 80GB SXM", 2039, 312, 80, source="datasheet"),
    "a100-40gb": GPUSpec("NVIDIA A100 40GB SXM", 1555, 312, 40, source="datasheet"),
    "h100-sxm": GPUSpec("NVIDIA H100 SXM", 3350, 989, 80, source="datasheet"),
    # Measured on this project's H200 (2026-11-29): device-to-device copy 4.15 TB/s, fp16
    # matmul 760 TFLOP/s; the datasheet says 4.8 TB/s and 989 TFLOP/s.
    "h200": GPUSpec("NVIDIA H200", 4150, 760, 141, source="measured on the card (copy bandwidth, fp16 matmul)"),
    "h200-datasheet": GPUSpec("NVIDIA H200", 4800, 989, 141, source="datasheet"),
}


GPU_ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm"}  # the short names users type for the presets
# The presets whose cards torch (and nvidia-smi) name otherwise: a sweep records torch's name, and
# `sim.cost.gpu_preset` finds the preset, and so the calibration's name, from it.
DEVICE_NAMES = {"NVIDIA A100-SXM4-80GB": "a100-80gb", "NVIDIA A100-SXM4-40GB": "a100-40gb",
                "NVIDIA H100 80GB HBM3": "h100-sxm"}


def get_gpu(name: str) -> GPUSpec:
    """The GPU preset `name` (or an alias of one: a100, h100), case-insensitive."""
    key = name.lower()
    try:
        return GPUS[GPU_ALIASES.get(key, key)]
    except KeyError:
        aliases = ", ".join(f"{a} ({p})" for a, p in GPU_ALIASES.items())
        raise ValueError(f"unknown GPU preset {name!r}; known: {', '.join(GPUS)}; aliases: {aliases}") from None


@dataclass(frozen=True)
class Roofline:
    """The five numbers, plus what they are made of."""

    model: str
    gpu: str
    weight_bytes: int
    batch1_floor_ms: float
    batch1_ceiling_tok_s: float
    kv_bytes_per_token: int
    ridge_flop_per_byte: float
    free_for_cache_gib: float
    free_measured: bool
    cache_token_positions: int
    cache_requests: int
    request_tokens: int

    def table(self) -> str:
        rows = [
            ("Weights", f"{self.weight_bytes / 1e9:.2f} GB", "read by a pass: every matrix once (an untied embedding is a lookup)"),
            ("Batch 1 ceiling", f"{self.batch1_ceiling_tok_s:,.0f} tok/s",
             f"weights / bandwidth = {self.batch1_floor_ms:.3g} ms to read them once"),
            ("KV cache", f"{self.kv_bytes_per_token:,} bytes/token", "2 x bytes x layers x KV heads x head dim"),
            ("Ridge point", f"{self.ridge_flop_per_byte:.0f} FLOP/byte", "peak FLOP/s / bandwidth"),
            ("Free for the cache", f"{self.free_for_cache_gib:.1f} GiB",
             ("measured on the card after loading" if self.free_measured else "estimated")
             + f": {self.cache_token_positions:,} token positions = {self.cache_requests} requests of "
               f"{self.request_tokens} tokens"),
        ]
        width = max(len(r[0]) for r in rows)
        head = f"Roofline: {self.model} on {self.gpu}"
        return "\n".join([head] + [f"  {a:<{width}}  {b:<22} {c}" for a, b, c in rows])


def free_for_cache_gib(model: ModelConfig, gpu: GPUSpec, dtype_bytes: int = 2) -> tuple[float, bool]:
    """GiB left for the KV cache: the card's measured figure when known, else an estimate of
    90% of the card minus the weights (the rest goes to the CUDA context and activations)."""
    if gpu.free_gib is not None:
        return gpu.free_gib, True
    total_gib = gpu.memory_gb * 1e9 / GIB
    return max(0.0, 0.9 * total_gib - model.weight_bytes(dtype_bytes) / GIB), False  # every weight, read or not


def roofline(model: ModelConfig, gpu: GPUSpec, dtype_bytes: int = 2, prompt_tokens: int = 4096,
             new_tokens: int = 256, free_gib: float | None = None) -> Roofline:
    """The five numbers. `free_gib`, when given, is memory measured free on the card after the
    model was loaded, and replaces the spec's figure."""
    weight_bytes = model.weight_bytes_read_per_pass(dtype_bytes)
    floor_s = weight_bytes / (gpu.bandwidth_gbs * 1e9)
    kv = model.kv_bytes_per_token(dtype_bytes)
    if free_gib is None:
        free, measured = free_for_cache_gib(model, gpu, dtype_bytes)
    else:
        free, measured = free_gib, True
    positions = int(free * GIB // kv)
    request_tokens = prompt_tokens + new_tokens
    return Roofline(
        model=model.name, gpu=gpu.name, weight_bytes=weight_bytes, batch1_floor_ms=floor_s * 1e3,
        batch1_ceiling_tok_s=1.0 / floor_s, kv_bytes_per_token=kv,
        ridge_flop_per_byte=gpu.ridge_flop_per_byte,
        free_for_cache_gib=free, free_measured=measured, cache_token_positions=positions,
        cache_requests=positions // request_tokens, request_tokens=request_tokens,
    )
