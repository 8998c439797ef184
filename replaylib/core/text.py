"""Values as one-line error messages show them."""
from __future__ import annotations

import reprlib

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def short(value) -> str:
    """A value's repr, cut to a line (a parameter can be a whole file)."""
    return _SHORT.repr(value)
