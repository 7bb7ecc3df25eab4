"""Residual charts of a fit (altair: HTML, and PNG where vl-convert renders it): predicted over
measured pass time, against the pass's size, per kind, fitted and held-out shapes apart."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from calibrate.fit import group_of
from core.atomic import write_text
from sim.html import chart_page


def residual_charts(passes, predicted, split, out: Path, name: str) -> list[Path]:
    """The charts' files written: the HTML page, and the PNG beside it unless it cannot be rendered
    (vl-convert missing or failing: said on stdout; the fit, already written, does not fail for it)."""
    import altair as alt

    df = pd.DataFrame({"kind": [p.kind for p in passes], "group": [group_of(p) for p in passes],
                       "batch_size": [len(p.new_tokens) for p in passes],
                       "tokens": [sum(p.new_tokens) for p in passes],
                       "context_sum": [sum(p.context_lens) for p in passes],
                       "measured_ms": [p.duration_s * 1e3 for p in passes],
                       "predicted_ms": [x * 1e3 for x in predicted], "split": split})
    df["error_pct"] = (df["predicted_ms"] / df["measured_ms"] - 1) * 100
    base = alt.Chart(df).mark_point(filled=True, opacity=0.6).encode(
        color=alt.Color("split:N", title=None), shape=alt.Shape("kind:N"),
        tooltip=["group", "measured_ms", "predicted_ms", "error_pct"])
    rule = alt.Chart(pd.DataFrame({"y": [0]})).mark_rule(color="gray").encode(y="y:Q")
    decode = base.transform_filter(alt.datum.kind == "decode").encode(
        x=alt.X("batch_size:Q", scale=alt.Scale(type="log"), title="decode batch size"),
        y=alt.Y("error_pct:Q", title="predicted / measured - 1 (%)"))
    prefill = base.transform_filter(alt.datum.kind != "decode").encode(
        x=alt.X("tokens:Q", scale=alt.Scale(type="log"), title="tokens in the pass (prefill, mixed)"),
        y=alt.Y("error_pct:Q", title="predicted / measured - 1 (%)"))
    scatter = base.encode(x=alt.X("measured_ms:Q", scale=alt.Scale(type="log"), title="measured pass (ms)"),
                          y=alt.Y("predicted_ms:Q", scale=alt.Scale(type="log"), title="predicted pass (ms)"))
    chart = ((decode + rule).properties(width=320, height=220, title="decode passes")
             | (prefill + rule).properties(width=320, height=220, title="prefill and mixed passes")
             | scatter.properties(width=260, height=220, title="all passes")).properties(
        title=f"{name}: the cost model against the timed passes (held-out: shapes the fit did not see)")
    paths = [out / f"{name}-residuals.html", out / f"{name}-residuals.png"]
    write_text(paths[0], chart_page(chart, f"{name}: residuals"))
    try:
        chart.save(str(paths[1]), ppi=100)
    except (ImportError, ValueError, RuntimeError) as e:  # altair: ValueError when vl-convert is not installed
        print(f"note: {paths[1].name} not drawn ({str(e).splitlines()[0][:160]}); the HTML page has the charts")
        paths[1].unlink(missing_ok=True)
        return paths[:1]
    return paths
