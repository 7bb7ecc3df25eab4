"""HTML the commands write keeps what it embeds as data: a hostile run label or path cannot end
the page's <script> or add markup, and the chart's spec still reads back unchanged."""
import json
from html.parser import HTMLParser

import pytest

from sim.__main__ import main
from sim.html import script_json

HOSTILE = "</script><script>alert(1)</script> \"q' & <b>\u2028"


class Elements(HTMLParser):
    """The start tags of a page, and the text of its title and of its inline scripts."""

    def __init__(self):
        super().__init__()
        self.tags, self.title, self.scripts, self._in = [], "", [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in = tag
        if tag == "script" and not dict(attrs).get("src"):
            self.scripts.append("")

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in == "title":
            self.title += data
        elif self._in == "script" and self.scripts:
            self.scripts[-1] += data


def test_script_json_reads_back_the_same_and_holds_no_markup_characters():
    value = {"label": HOSTILE, "list": ["<!--", "-->", "&amp;"]}
    text = str(script_json(value))
    assert json.loads(text) == value
    assert not set("<>&\u2028") & set(text)


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """A simulated run whose metrics.json names a policy that is markup, in a directory whose
    name holds quotes, angle brackets and an ampersand."""
    d = tmp_path_factory.mktemp("hostile")
    trace = d / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n"
                     + "".join(f"{i * 0.02:.3f},{64 + 29 * i % 200},{4 + 7 * i % 40}\n" for i in range(12)))
    run = d / "run \"<i>&amp;'"
    assert main(["run", "--trace", str(trace), "--pass-log", "on", "--out", str(run)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["spec"]["policy"] = HOSTILE
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def test_a_hostile_label_and_path_appear_in_the_plot_only_escaped(hostile_run, tmp_path):
    out = tmp_path / "charts"
    assert main(["plot", str(hostile_run), "--out", str(out)]) == 0
    for name in ("latency-cdf", "over-time"):
        html = (out / f"{name}.html").read_text()
        assert "alert(1)</script>" not in html and "<b>" not in html and "<i>" not in html
        page = Elements()
        page.feed(html)
        assert page.tags.count("script") == 4 and "b" not in page.tags and "i" not in page.tags
        assert page.title == f"{name}: {hostile_run}"  # the parser unescapes what the page escaped
        script, = page.scripts
        start = script.index("vegaEmbed(\"#vis\", ") + len("vegaEmbed(\"#vis\", ")
        spec, _ = json.JSONDecoder().raw_decode(script[start:])
        runs = {row["run"] for rows in spec["datasets"].values() for row in rows if "run" in row}
        assert runs == {HOSTILE}


def test_the_residual_charts_page_escapes_the_calibrations_name(tmp_path):
    from calibrate.charts import residual_charts
    from core.records import PassRecord

    passes = [PassRecord(run_id="r", engine="continuous", step=i, kind=kind, new_tokens=new, context_lens=ctx,
                         start_s=0.0, duration_s=0.01 * (i + 1))
              for i, (kind, new, ctx) in enumerate([("decode", [1, 1], [10, 20]), ("prefill", [64], [0])])]
    name = "cal \"<b>&amp;'"  # a calibration's name is a file name: no slash, anything else
    html_path, _ = residual_charts(passes, [0.011, 0.018], ["fit", "held-out"], tmp_path, name)
    html = html_path.read_text()
    page = Elements()
    page.feed(html)
    assert page.tags.count("script") == 4 and "b" not in page.tags and "<b>" not in html
    assert page.title == f"{name}: residuals"
    script, = page.scripts
    spec, _ = json.JSONDecoder().raw_decode(script[script.index("vegaEmbed(\"#vis\", ") + len("vegaEmbed(\"#vis\", "):])
    assert spec["title"].startswith(f"{name}: the cost model")


def test_the_residual_charts_keep_their_html_when_no_png_can_be_rendered(tmp_path, monkeypatch, capsys):
    """A calibration run on a machine without vl-convert (the fit has written its calibration by
    then): the HTML page, no PNG, one note; not a traceback that fails the run."""
    import altair as alt

    from calibrate.charts import residual_charts
    from core.records import PassRecord

    def no_png(self, fp, **kw):
        if str(fp).endswith(".png"):
            raise ValueError("Saving charts in 'png' format requires the vl-convert-python package: see ...")
    monkeypatch.setattr(alt.TopLevelMixin, "save", no_png)
    passes = [PassRecord(run_id="r", engine="continuous", step=0, kind="decode", new_tokens=[1], context_lens=[9],
                         start_s=0.0, duration_s=0.01)]
    paths = residual_charts(passes, [0.011], ["fit"], tmp_path, "h200")
    assert paths == [tmp_path / "h200-residuals.html"] and paths[0].exists()
    assert not (tmp_path / "h200-residuals.png").exists()
    assert "h200-residuals.png not drawn (Saving charts in 'png' format requires the vl-convert" in capsys.readouterr().out
