"""How the GPU's pass times answer to prompt work, measured by design (`python -m calibrate heat`).

The sweep runs its shapes in a shuffled order, so its passes follow prompt work of every size
at every distance, but never a long rest or a long run of prompts: the heat model (`sim.heat`)
fitted on it alone cannot tell whether the slow-down sets in at once or builds up during a long
prompt pass, nor how fast the card recovers. Here, each after a rest of `rest_s`:

- `rested`:   a probe decode pass (64 sequences on 512 cached positions) 100 times;
- `burst K`:  K prompt passes of 4,096 tokens back to back (K = 1 .. 100: 20 ms .. 2 s), then the
              probe 400 times (about 0.9 s): the prompts' own times show the onset, the probes
              the recovery;
- `big`:      one pass of 16 prompts of 4,096 tokens (65,536 tokens, about 0.37 s) from rest, then
              100 probes, and `big-hot`: the same after 50 prompt passes;
- `decode`:   the probe 1,000 times from rest (decode work alone does not heat the card);
- `mixed K`, `chunks K`, `small K`: K passes of a 2,048-token chunk beside 64 decodes (as chunked
              prefill builds them), of a 2,048-token prompt, of a 512-token prompt, then the probe
              400 times: which passes heat the card besides long prompts;
- `mixed 60, b256`: the same chunk beside 256 decodes on 1,000 cached positions (as a saturated
              engine's chunked prefill builds them: more of the pass is decode attention's reads),
              then the probe 400 times; `decode b256 c1000`: 300 such decode passes from rest
              (whether a long run of large decode passes slows by itself);
- `after 30, bB cC`: 30 prompt passes, then 300 decode passes of B sequences on C cached
              positions (B 16, 256, 512): how much decode passes of other sizes slow;
- `serving`:  200 times a 4,096-token prompt pass followed by 10 decode passes of 256 sequences
              on 1,024 cached positions (15-19 s on the H200), as a saturated engine alternates
              them: whether the slow-down keeps growing past the bursts' 2 s; the fit holds it out
              and prices it (`calibrate.heat.CHECKED`);
- `serving chunked`: 200 times the `mixed 60, b256` pass followed by 2 decode passes of its 256
              sequences, as a saturated engine's chunked prefill alternates them (its mixed passes
              beside the decode batches of requests with no prompt left), held out and priced alike.

Every segment `repeats` times, round-robin; passes launched as the serving loop launches them
(`run_sweep(launch="served")`), timed with CUDA events, start times on one clock for the run.
"""
from __future__ import annotations

import dataclasses
import time

from calibrate.sweep import Shape, run_sweep
from core.records import PassRecord

PROBE = Shape("probe b64 c512", tuple((512, 1) for _ in range(64)))
PROMPT = Shape("prompt n4096", ((0, 4096),))
BIG = Shape("prompts 16x4096", tuple((0, 4096) for _ in range(16)))
BURSTS = (1, 3, 10, 30, 100)


MIXED = Shape("mixed n2048 b64", tuple((512, 1) for _ in range(64)) + ((0, 2048),))
DECODES = (Shape("decode b16 c512", tuple((512, 1) for _ in range(16))),
           Shape("decode b256 c1024", tuple((1024, 1) for _ in range(256))),
           Shape("decode b512 c2048", tuple((2048, 1) for _ in range(512))))
MIXED_BIG = Shape("mixed n2048 b256", tuple((1000, 1) for _ in range(256)) + ((0, 2048),))
SUSTAINED = Shape("decode b256 c1000", tuple((1000, 1) for _ in range(256)))
CHUNK = Shape("prompt n2048", ((0, 2048),))
SMALL = Shape("prompt n512", ((0, 512),))


def segments(scale: float = 1.0, probe: Shape = PROBE, prompt: Shape = PROMPT, big: Shape = BIG, mixed: Shape = MIXED,
             chunk: Shape = CHUNK, small: Shape = SMALL, decodes: tuple = DECODES, mixed_big: Shape = MIXED_BIG,
             sustained: Shape = SUSTAINED) -> list[tuple[str, list[Shape]]]:
    """The designed sequences, each (name, shapes in order); `scale` < 1 shortens them, and a CPU
    smoke run passes smaller shapes."""
    def n(k: int) -> int:
        return max(1, int(k * scale))
    out = [("rested", [probe] * n(100))]
    out += [(f"burst {k}", [prompt] * n(k) + [probe] * n(400)) for k in BURSTS]
    out += [("big", [big] + [probe] * n(100)), ("big-hot", [prompt] * n(50) + [big] + [probe] * n(100)),
            ("decode", [probe] * n(1000))]
    out += [("mixed 60", [mixed] * n(60) + [probe] * n(400)), ("chunks 60", [chunk] * n(60) + [probe] * n(400)),
            ("small 200", [small] * n(200) + [probe] * n(400)),
            ("mixed 60, b256", [mixed_big] * n(60) + [probe] * n(400)), (sustained.group, [sustained] * n(300))]
    out += [(f"after 30, {d.group.removeprefix('decode ')}", [prompt] * n(30) + [d] * n(300)) for d in decodes]
    out += [("serving", ([prompt] + [decodes[1]] * 10) * n(200))]
    out += [("serving chunked", ([mixed_big] + [sustained] * 2) * n(200))]
    return out


CPU_SHAPES = {"probe": Shape("probe b4 c32", tuple((32, 1) for _ in range(4))), "prompt": Shape("prompt n64", ((0, 64),)),
              "big": Shape("prompts 4x64", tuple((0, 64) for _ in range(4))),
              "mixed": Shape("mixed n32 b4", tuple((32, 1) for _ in range(4)) + ((0, 32),)),
              "chunk": Shape("prompt n32", ((0, 32),)), "small": Shape("prompt n16", ((0, 16),)),
              "mixed_big": Shape("mixed n32 b8", tuple((32, 1) for _ in range(8)) + ((0, 32),)),
              "sustained": Shape("decode b8 c48", ((48, 1),) * 8),
              "decodes": (Shape("decode b2 c32", ((32, 1),) * 2), Shape("decode b8 c64", ((64, 1),) * 8),
                          Shape("decode b16 c64", ((64, 1),) * 16))}


def measure(runner, plan, repeats: int, rest_s: float, run_id: str, progress=None) -> tuple[list[PassRecord], list[dict]]:
    """Every segment of `plan` `repeats` times after a rest; (passes, segment marks: name, repeat,
    t0_s and the first and last pass index of each)."""
    records: list[PassRecord] = []
    marks: list[dict] = []
    origin = None
    for rep in range(repeats):
        for name, seg in plan:
            time.sleep(rest_s)
            passes = run_sweep(runner, seg, repeats=1, run_id=run_id, shuffled=False, launch="served", warm_up=False)
            origin = runner.clock.t0 if origin is None else origin
            t0 = runner.clock.t0 - origin  # the sweep zeroes the runner's clock as it starts
            first = len(records)
            records += [dataclasses.replace(p, start_s=p.start_s + t0, step=first + i) for i, p in enumerate(passes)]
            marks.append({"segment": name, "repeat": rep, "t0_s": t0, "first": first, "last": len(records) - 1})
            if progress is not None:
                progress(name, rep, passes)
    return records, marks


def telemetry(path, gpu_index: str):
    """nvidia-smi sampling the SM clock, power, temperature and clock-event reasons every 20 ms
    into `path` (a Popen to terminate; None where there is no nvidia-smi)."""
    import shutil
    import subprocess
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    fields = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,pcie.link.gen.current,clocks_event_reasons.active"
    probe = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader", "-i", gpu_index],
                           capture_output=True, text=True)
    if probe.returncode != 0:  # older drivers name them the throttle reasons
        fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")
    return subprocess.Popen([smi, f"--query-gpu={fields}", "--format=csv", "-lms", "20", "-i", gpu_index],
                            stdout=open(path, "w"), stderr=subprocess.DEVNULL)
