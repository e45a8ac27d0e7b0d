"""json.loads, cheaper where it runs cold: on the low-load path each message and result
is parsed after an idle spell, where json.loads enters several Python functions and sets
up its C scanner before it reads a byte; orjson parses in one C call.

orjson parses what it accepts as json.loads does. Everything else goes to json.loads
itself, so the value, or the error, is always json.loads's: what orjson refuses (NaN,
Infinity, numbers past a double, a BOM, UTF-16, lone surrogates, deep nesting), and
any text with a run of 19 digits, since orjson reads an integer past 64 bits as a
float where json.loads keeps it exact (18 digits always fit).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"\d{19}")
_LONG_DIGITS_STR = re.compile(r"\d{19}")


def loads(data: bytes | str) -> Any:
    """json.loads(data): its value, or the error it raises."""
    if isinstance(data, bytes):
        long = _LONG_DIGITS.search(data) is not None
    else:
        long = _LONG_DIGITS_STR.search(data) is not None
    if not long:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
