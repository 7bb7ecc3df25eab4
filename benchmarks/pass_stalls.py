"""How a run's passes spread in time: per replica, the share of passes that last a whole 8 or
16 ms (the two-replica stall of `results/continuous/README.md`), and the host's time to launch a
pass (`launch_s`), so that a stall can be told apart from GPU work.

    python benchmarks/pass_stalls.py results/continuous/<run_id> [...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from core.records import read_pass_records  # noqa: E402


def describe(run: Path) -> str:
    passes = read_pass_records(run / "passes.jsonl.gz")
    lines = [f"{run.name}: {len(passes)} passes"]
    for replica in sorted({p.replica for p in passes}):
        mine = [p for p in passes if p.replica == replica]
        d = np.array([p.duration_s for p in mine]) * 1e3
        launch = np.array([p.launch_s for p in mine]) * 1e3
        at8 = np.mean(np.abs(d - 8.0) < 0.1) * 100
        at16 = np.mean(np.abs(d - 16.0) < 0.1) * 100
        lines.append(f"  replica {replica}: {len(mine)} passes, duration p50 {np.median(d):.2f} ms, "
                     f"{at8:.1f}% at 8.0 ms, {at16:.1f}% at 16.0 ms; launch p50 {np.median(launch):.3f} ms, "
                     f"p99 {np.percentile(launch, 99):.3f} ms, max {launch.max():.2f} ms, "
                     f"{np.mean(launch > 4) * 100:.1f}% over 4 ms")
    return "\n".join(lines)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(describe(Path(arg)))
