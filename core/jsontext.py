"""JSON that every reader takes: NaN and infinities (which Python's json writes as bare NaN and
Infinity, not JSON) become null on the way out, and null numbers become NaN on the way back."""
from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float inside dicts, lists and tuples replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """json.dumps of `value` as valid JSON: NaN and inf written as null."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def nan_for_null(numbers: dict) -> dict:
    """A dict of numbers read back from JSON, with null (a NaN or inf when written) as NaN."""
    return {k: math.nan if v is None else v for k, v in numbers.items()}
