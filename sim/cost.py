"""Step-cost models: how long one forward pass takes, from the shape of its batch.

One interface, no base class to inherit:

    pass_time(new_tokens, context_lens) -> seconds
        new_tokens[i] tokens of sequence i go through the model on top of context_lens[i]
        tokens already in its KV cache (the PassRecord's two lists).
    decode_line(batch_size, context_sum, context_max) -> (a, b, valid) or None
        For a run of decode passes (one new token per sequence, every context one longer each
        pass) whose first pass has contexts summing to `context_sum`, the longest `context_max`:
        pass j (from 0) takes a + b*j seconds, for j < valid. The simulator uses it to advance
        such runs in one step; None makes it step pass by pass.

Implementations:
- `RooflineCost`: the engine's roofline numbers: max(bytes / bandwidth, FLOPs / peak) plus a
  fixed per-pass overhead.
- `CalibratedCost`: the engine's measured pass times, as a hardware-grounded model fitted on
  passes timed on the GPU (`calibrate/`), read from a JSON file; `calibrated:h200` names the
  committed one. Projected, uncalibrated, to another GPU (`calibrated:h200@a10`,
  `CalibratedCost.projected`) or another model on the same GPU (`calibrated:qwen2.5-1.5b/h200`
  with `--model tiny`, `CalibratedCost.projected_to_model`; what `--cost auto` falls back to
  for a model without its own calibration).
- `ConstantCost`, `TableCost`: for tests and back-of-envelope runs.
- `ScaledCost`: another model's passes, every one a factor longer (`sim compare --cost-error`;
  `--cost calibrated:h200*1.02` on the command line).

Calibration file (format "llm-sim-cost/v5", written by `python -m calibrate fit` from passes
timed on the real engine; `CalibratedCost` documents the form and its parameters, `sim.host` and
`sim.heat` its optional "host" and "heat" fields).
"""
from __future__ import annotations

import json
import math
import os
import sys
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Protocol, Sequence

from core.config import PRESETS, ModelConfig, resolve_model
from core.roofline import GPU_ALIASES, GPUS, GPUSpec, get_gpu
from sim.calibrated import FORMAT, CalibratedCost, bucket  # noqa: F401 (FORMAT, bucket: the file's)
from traces.trace import MAX_ARRIVAL_S

ALWAYS = 1 << 62  # "valid for every pass of any run"


class CostModel(Protocol):
    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float: ...

    def decode_line(self, batch_size: int, context_sum: int,
                    context_max: int | None = None) -> tuple[float, float, int] | None: ...


def _upper_line(a0: float, a1: float, b0: float, b1: float) -> tuple[float, float, int]:
    """max(a0 + a1*j, b0 + b1*j) over j >= 0 as the line on top at j = 0 and how many j it stays
    on top for (two lines cross at most once)."""
    if (b0, b1) > (a0, a1):
        a0, a1, b0, b1 = b0, b1, a0, a1
    if a1 >= b1:
        return a0, a1, ALWAYS
    return a0, a1, int((a0 - b0) / (b1 - a1)) + 1


class RooflineCost:
    """A pass reads the weights and the KV cache and does its FLOPs; it takes the longer of
    bytes / bandwidth and FLOPs / peak, plus `overhead_s`.

    bytes = weight bytes + (context + new tokens) x KV bytes per token (read, and written);
    FLOPs = new tokens x ModelConfig.flops_per_token() + attention: a new token at position p
    attends to p positions, at the per-position cost of ModelConfig.flops_per_token.
    overhead_s defaults to 0.3 ms, a CUDA-graph decode step's launch and host overhead.
    """

    def __init__(self, model: ModelConfig, gpu: GPUSpec, overhead_s: float = 3e-4, dtype_bytes: int = 2):
        if overhead_s < 0:
            raise ValueError(f"overhead_s must be >= 0, got {overhead_s}")
        self.model, self.gpu, self.overhead_s = model, gpu, overhead_s
        self.weight_bytes = model.weight_bytes_read_per_pass(dtype_bytes)
        self.kv_bytes = model.kv_bytes_per_token(dtype_bytes)
        self.flops_per_token = model.flops_per_token(0)
        self.attn_flops = model.flops_per_token(1) - self.flops_per_token  # per attended position
        self.bandwidth = gpu.bandwidth_gbs * 1e9
        self.peak = gpu.fp16_tflops * 1e12

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        n = c = positions = 0
        for x, y in zip(new_tokens, context_lens):
            n += x
            c += y
            positions += x * (2 * y + x + 1)  # twice the positions x new tokens attend to
        memory = (self.weight_bytes + self.kv_bytes * (c + n)) / self.bandwidth
        compute = (self.flops_per_token * n + self.attn_flops * (positions // 2)) / self.peak
        return self.overhead_s + (memory if memory > compute else compute)

    def decode_line(self, batch_size: int, context_sum: int, context_max: int | None = None) -> tuple[float, float, int]:
        b, c = batch_size, context_sum
        m0 = (self.weight_bytes + self.kv_bytes * (c + b)) / self.bandwidth
        m1 = self.kv_bytes * b / self.bandwidth
        f0 = (self.flops_per_token * b + self.attn_flops * (c + b)) / self.peak
        f1 = self.attn_flops * b / self.peak
        a, slope, valid = _upper_line(m0, m1, f0, f1)
        return self.overhead_s + a, slope, valid


class ConstantCost:
    """Every pass takes `seconds` (queueing-theory tests, what-ifs on a fixed step time)."""

    def __init__(self, seconds: float):
        if seconds <= 0:
            raise ValueError(f"a pass must take a positive time, got {seconds}")
        self.seconds = seconds

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        return self.seconds

    def decode_line(self, batch_size: int, context_sum: int, context_max: int | None = None) -> tuple[float, float, int]:
        return self.seconds, 0.0, ALWAYS


class TableCost:
    """A pass's time looked up by its token count: linear between the given points, flat
    beyond the first and last."""

    def __init__(self, seconds_by_tokens: dict[int, float]):
        if not seconds_by_tokens or any(v <= 0 for v in seconds_by_tokens.values()):
            raise ValueError("TableCost needs at least one point, all times positive")
        self.points = sorted(seconds_by_tokens.items())

    def time_for(self, num_tokens: int) -> float:
        pts = self.points
        if num_tokens <= pts[0][0]:
            return pts[0][1]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if num_tokens <= x1:
                return y0 + (y1 - y0) * (num_tokens - x0) / (x1 - x0)
        return pts[-1][1]

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        return self.time_for(sum(new_tokens))

    def decode_line(self, batch_size: int, context_sum: int, context_max: int | None = None) -> tuple[float, float, int]:
        return self.time_for(batch_size), 0.0, ALWAYS


class ScaledCost:
    """Another cost model with every pass `factor` times as long (its host time, heat and scatter
    as they are): how far a simulated result moves when the cost model is off by that much."""

    def __init__(self, cost: CostModel, factor: float):
        if not factor > 0:
            raise ValueError(f"a cost model's passes can only be scaled by a positive factor, got {factor}")
        self.cost, self.factor = cost, factor

    def pass_time(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> float:
        return self.cost.pass_time(new_tokens, context_lens) * self.factor

    def decode_line(self, batch_size: int, context_sum: int, context_max: int | None = None) -> tuple[float, float, int] | None:
        line = self.cost.decode_line(batch_size, context_sum, context_max)
        return None if line is None else (line[0] * self.factor, line[1] * self.factor, line[2])

    def __getattr__(self, name: str):  # host, heat, noise, extrapolated: the scaled model's own
        if name == "cost":  # (not set yet: copy and pickle look before __init__ ran)
            raise AttributeError(name)
        return getattr(self.cost, name)


SHIPPED = "calibrations"  # package data: sim/calibrations/<model>/<gpu>.json
USER_DIR_VAR = "LLMSIM_CALIBRATIONS"


def user_calibrations() -> Path:
    """Where a user's own calibrations are: $LLMSIM_CALIBRATIONS, else the user data directory
    (`python -m calibrate fit` writes there by default)."""
    env = os.environ.get(USER_DIR_VAR)
    if env:
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "llm-serving-sim" / "calibrations"


def calibration_dirs(model: str) -> list[Path | Traversable]:
    """The folders `calibrated:NAME` looks in for NAME.json, in order: the user's, then the package's."""
    return [user_calibrations() / model, resources.files("sim") / SHIPPED / model]


def find_calibration(name: str, model: str) -> Path | Traversable | None:
    """The calibration file `calibrated:NAME` means for `model`, or None."""
    for folder in calibration_dirs(model):
        path = folder / f"{name}.json"
        if path.is_file():
            return path
    return None


def known_calibrations(model: str) -> list[str]:
    """The names `calibrated:NAME` accepts for `model`."""
    names = set()
    for folder in calibration_dirs(model):
        if folder.is_dir():
            names.update(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))
    return sorted(names)


DEFAULT = "auto"
_said: set[str] = set()  # the notes said in this process (each once); `forget_notes` clears it


def say_once(key: str, text: str) -> None:
    """`text` on stderr, once per process for each `key`."""
    if key not in _said:
        _said.add(key)
        print(text, file=sys.stderr)


def forget_notes() -> None:
    """Every note may be said again (the tests call it before each test: which notes a test sees
    must not depend on the tests that ran before it in the same process)."""
    _said.clear()


def calibrated_models(name: str) -> list[str]:
    """The models with a calibration `name` (a GPU's, e.g. h200): the user's and the package's
    folders, model presets only (the others cannot be projected from)."""
    found = set()
    for root in (user_calibrations(), resources.files("sim") / SHIPPED):
        if root.is_dir():
            found.update(d.name for d in root.iterdir() if d.is_dir() and (d / f"{name}.json").is_file())
    return sorted(m for m in found if m in PRESETS)


def nearest_calibrated(model: str, name: str) -> str | None:
    """The other model with a calibration `name` nearest to `model` by weight bytes (by their
    ratio, the smaller model first at a tie), or None."""
    weights = resolve_model(model).weight_bytes_read_per_pass()
    others = [m for m in calibrated_models(name) if m != model_key(model)]
    if not others:
        return None

    def distance(m: str) -> tuple[float, int, str]:
        w = resolve_model(m).weight_bytes_read_per_pass()
        return abs(math.log(w / weights)), w, m
    return min(others, key=distance)


def say_projection(source: str, name: str, model: str, given: str, first: str = "") -> None:
    """Say once, on stderr, that `model`'s passes are priced by `source`'s calibration `name`
    projected to it (`given`: the model as the user named it; `first`: what the line starts with)."""
    say_once(f"{source}/{name}->{model}",
             f"note: {first}{model}'s passes are priced by {source}'s {name} calibration projected by the two "
             f"models' roofline terms (weight bytes, KV bytes and FLOPs per token, layers): a projection, "
             f"uncalibrated for {model} (Qwen2.5-1.5B's projected to Llama-3.1-8B on an H200 was 5% off on batched "
             f"decode, 13% on batch 1, 11% on mixed passes); "
             f"calibrate {model} with `python -m calibrate run --model {given}`")


def default_cost(model: str, gpu: str | None) -> str:
    """What `--cost` means when it is not given: the calibration for `model` on `gpu` (default h200)
    when there is one; else another model's calibration on that GPU projected to `model`
    (`CalibratedCost.projected_to_model`; the nearest calibrated model by weight bytes); else that
    GPU's roofline. The last two say so, once, on stderr."""
    gpu = (gpu or "h200").lower()
    gpu = GPU_ALIASES.get(gpu, gpu)  # (a calibration is named for the preset: a100 -> a100-80gb)
    given, model = model, model_key(model)  # (given: a preset's name or a config.json's path)
    if find_calibration(gpu, model) is not None:
        return f"calibrated:{gpu}"
    source = nearest_calibrated(given, gpu)
    if source is not None:
        spec = f"calibrated:{source}/{gpu}"
        say_projection(source, gpu, model, given, first=f"no calibration for {model} on {gpu}: using --cost {spec}; ")
        return spec
    spec = f"roofline:{gpu}"
    say_once(f"{model}:{spec}", f"note: no calibration for {model} on {gpu}: passes are priced by the uncalibrated roofline"
                   f"{roofline_error()}; give --cost, or calibrate your GPU (python -m calibrate --help)")
    return spec


def roofline_error() -> str:
    """How far the roofline was from the measured engine, as the shipped H200 calibration records it."""
    try:
        shipped = json.loads((resources.files("sim") / SHIPPED / "qwen2.5-1.5b" / "h200.json").read_text())
        errors = [-e["signed_median"] for e in shipped["roofline_prior_error"]]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return (f", which on the H200 priced passes {min(errors):.0%}-{max(errors):.0%} shorter than the measured engine took "
            f"(Qwen2.5-1.5B)")


def model_key(model: str) -> str:
    """The name calibrations are filed under for `--model`: the preset's name, or a config.json's
    (its folder's name)."""
    return resolve_model(model).name


def parse_cost(spec: str, model: str = "qwen2.5-1.5b", overhead_s: float = 3e-4) -> tuple[CostModel, GPUSpec | None]:
    """A cost model from a CLI spec: "roofline:GPU" (a preset of core.roofline), "constant:SECONDS",
    "calibrated:NAME" (NAME.json for `model`: `user_calibrations()`'s, else the package's; e.g. calibrated:h200),
    "calibrated:MODEL/NAME" (another model's calibration projected to `model`,
    `CalibratedCost.projected_to_model`, said once on stderr), "calibrated:...@GPU" (that calibration projected to
    another GPU preset, `CalibratedCost.projected`), or the path of a calibration JSON for
    `model`; any of them followed by "*FACTOR" has every pass FACTOR times as long (`ScaledCost`:
    calibrated:h200*1.02 is the H200 calibration with passes 2% slower, as a card or a load its
    error leaves out could make them). Returns it and the GPU preset it stands for (None when it
    names none)."""
    base, star, factor = spec.rpartition("*")
    if star and not Path(spec).exists():
        return _scaled(spec, base, factor, model, overhead_s)
    kind, sep, arg = spec.partition(":")
    if kind == "roofline" and sep:
        gpu = _gpu(spec, arg)
        return RooflineCost(resolve_model(model), gpu, overhead_s), gpu
    if kind == "constant" and sep:
        try:
            seconds = float(arg)
        except ValueError:
            raise ValueError(f"--cost {spec!r}: {arg!r} is not a number of seconds") from None
        if not 0 < seconds <= MAX_ARRIVAL_S:
            raise ValueError(f"--cost {spec!r}: a pass must take a finite, positive time of at most {MAX_ARRIVAL_S:g} s")
        return ConstantCost(seconds), None
    if kind == "calibrated" and sep:
        named, at, target = arg.partition("@")
        source, slash, name = named.rpartition("/")
        source = source if slash else model_key(model)
        if slash and source not in PRESETS:
            raise ValueError(f"--cost {spec!r}: {source!r} is no model preset, so its calibration cannot be projected "
                             f"to {model} (known: {', '.join(PRESETS)})")
        path = find_calibration(name, source)
        if path is None:
            known = ", ".join(known_calibrations(source)) or "none"
            others = [f"{m}/{name}" for m in calibrated_models(name) if m != source]
            hint = (f"; other models' {name!r}: {', '.join(others)} (--cost calibrated:{others[0]} projects it to "
                    f"{model})" if others and not slash else "")
            raise ValueError(f"--cost {spec!r}: no calibration named {name!r} for {source} in "
                             f"{user_calibrations() / source} or the package's (known: {known}){hint}")
        cost = CalibratedCost.from_json(path, source)
        measured_on = _measured_on(spec, path, cost)
        gpu_named = _gpu(spec, name) if name.lower() in GPUS else None
        if gpu_named is not None and gpu_named.name != measured_on.name:
            raise ValueError(f"{path}: a calibration named {name!r} measured on {cost.gpu!r}, not on "
                             f"{gpu_named.name}; rename it for its GPU")
        key = model_key(model)
        if source != key:
            cost = cost.projected_to_model(resolve_model(source), resolve_model(model), measured_on)
            say_projection(source, name, key, model)
        if not at:
            return cost, measured_on
        return cost.projected(_gpu(spec, target), measured_on), _gpu(spec, target)
    if spec.endswith(".json") or Path(spec).exists():
        cost = CalibratedCost.from_json(spec, model_key(model))
        return cost, _measured_on(spec, spec, cost)
    raise ValueError(f"--cost {spec!r}: expected roofline:GPU, constant:SECONDS, calibrated:[MODEL/]NAME[@GPU] or a "
                     f"calibration .json file")


MAX_SCALE = 100.0  # a scaled cost model's factor, at most (and at least its inverse)


def _scaled(spec: str, base: str, factor: str, model: str, overhead_s: float) -> tuple[CostModel, GPUSpec | None]:
    try:
        f = float(factor)
    except ValueError:
        f = math.nan
    if not 1 / MAX_SCALE <= f <= MAX_SCALE:  # (nan fails too)
        raise ValueError(f"--cost {spec!r}: {factor!r} after '*' must be a factor from {1 / MAX_SCALE:g} to "
                         f"{MAX_SCALE:g} (every pass that many times as long), e.g. calibrated:h200*1.02")
    if not base:
        raise ValueError(f"--cost {spec!r}: name the cost model to scale before '*', e.g. calibrated:h200*1.02")
    cost, gpu = parse_cost(base, model, overhead_s)
    return ScaledCost(cost, f), gpu


def _measured_on(spec: str, path, cost: "CalibratedCost") -> GPUSpec:
    """The GPU preset a calibration was measured on: it sizes the run's KV cache, so a GPU that no
    preset describes is an error rather than a guess."""
    preset = gpu_preset(cost.gpu)[1]
    if preset is None:
        raise ValueError(f"{path}: measured on {cost.gpu!r}, which no GPU preset describes (known: "
                         f"{', '.join(sorted({g.name for g in GPUS.values()}))})")
    return preset


def _gpu(spec: str, name: str) -> GPUSpec:
    try:
        return get_gpu(name)
    except ValueError as e:
        raise ValueError(f"--cost {spec!r}: {e}") from None


def gpu_preset(name: str) -> tuple[str | None, GPUSpec | None]:
    """The preset (its key and spec) of a GPU named as torch names it ("NVIDIA H200"): the
    measured one when there is one; (None, None) when no preset describes it."""
    from core.roofline import DEVICE_NAMES, GPUS
    if name in DEVICE_NAMES:  # torch's name for a preset's card
        return DEVICE_NAMES[name], GPUS[DEVICE_NAMES[name]]
    named = [(k, v) for k, v in GPUS.items() if v.name == name]
    measured = [(k, v) for k, v in named if v.source.startswith("measured")]
    return (measured or named or [(None, None)])[0]
