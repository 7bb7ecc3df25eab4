"""HTML pages the commands write, escaped: text through jinja2's autoescape, JSON made safe to
sit inside a <script> (a run label such as `</script><script>...` stays data).

`script_json` and `chart_page` are for every page the project writes (sim plot, calibrate fit's
residual charts; sim compare's report can call them too)."""
from __future__ import annotations

import json
from typing import Any

import jinja2
import markupsafe

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
# Inside <script> the HTML parser ends the element at "</script" and JavaScript ends a line at
# U+2028/U+2029: as JSON escapes none of them can break out, and the parsed value is unchanged.
_IN_SCRIPT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                            "\u2028": "\\u2028", "\u2029": "\\u2029"})

CDN = "https://cdn.jsdelivr.net/npm"

_CHART_PAGE = _ENV.from_string("""<!DOCTYPE html>
<html>
<head>
  <meta charset="utf-8">
  <title>{{ title }}</title>
  <style>#vis.vega-embed { width: 100%; display: flex; }</style>
  <script type="text/javascript" src="{{ cdn }}/vega@{{ vega }}"></script>
  <script type="text/javascript" src="{{ cdn }}/vega-lite@{{ vegalite }}"></script>
  <script type="text/javascript" src="{{ cdn }}/vega-embed@{{ vegaembed }}"></script>
</head>
<body>
  <div id="vis"></div>
  <script>
    vegaEmbed("#vis", {{ spec }}, {{ options }}).catch(console.error);
  </script>
</body>
</html>
""")


def script_json(value: Any) -> markupsafe.Markup:
    """`value` as JSON that can be placed inside a <script> element as it is."""
    return markupsafe.Markup(json.dumps(value).translate(_IN_SCRIPT))


def chart_page(chart: Any, title: str) -> str:
    """An altair chart as a whole HTML page (vega-embed from the CDN, as altair's own page), its
    spec and `title` escaped; altair's `save` puts the spec in its <script> as plain JSON."""
    import altair as alt

    return _CHART_PAGE.render(title=title, spec=script_json(chart.to_dict()), options=script_json({"mode": "vega-lite"}),
                              cdn=CDN, vega=alt.VEGA_VERSION, vegalite=alt.VEGALITE_VERSION,
                              vegaembed=alt.VEGAEMBED_VERSION)
