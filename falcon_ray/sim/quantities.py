"""Kubernetes resource quantities (``resource.Quantity``), as the apiserver decodes and stores them.

Contract
--------
* A quantity arrives as a JSON string (``"4"``, ``"500m"``, ``"16Gi"``, ``"1e3"``)
  or a JSON number (``4``, ``0.5``): the apiserver accepts both and they mean
  the same (``google.com/tpu: 4`` is ``google.com/tpu: "4"``).
* ``parse_quantity(value)`` -> :class:`Quantity` (exact ``Decimal`` value and its
  format: ``BinarySI``, ``DecimalSI`` or ``DecimalExponent``), or ``ValueError``
  with the apiserver's wording for anything else (booleans, objects, ``"4x"``).
  Precision below 1n (10^-9) is rounded up, as the apiserver does.
* ``canonical(value)`` -> the string the apiserver stores and answers: the
  format of the input, the largest suffix that keeps an integer mantissa
  (``0.5`` -> ``"500m"``, ``"1.5Gi"`` -> ``"1536Mi"``, ``2000`` -> ``"2k"``);
  a binary value that is not a whole number, or lies strictly between -1024
  and 1024, is written in decimal form (``"0.5Ki"`` -> ``"512"``).
* ``whole_units(value)`` -> the value rounded up to an integer (how the
  scheduler counts an extended resource such as ``google.com/tpu``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

_SYNTAX = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}  # powers of 1024
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXP = {e: s for s, e in _DECIMAL.items()}
_NANO = Decimal("1e-9")
SYNTAX_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


@dataclass(frozen=True)
class Quantity:
    value: Decimal
    format: str  # BinarySI | DecimalSI | DecimalExponent


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("quantity must be a string or a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(SYNTAX_ERROR)
        return repr(value)
    return str(value)


def parse_quantity(value: Any) -> Quantity:
    text = _text(value).strip()
    m = _SYNTAX.match(text)
    if not m:
        raise ValueError(SYNTAX_ERROR)
    number, suffix = m.groups()
    try:
        mantissa = Decimal(number)
    except InvalidOperation:
        raise ValueError(SYNTAX_ERROR) from None
    if suffix in _BINARY:
        amount, fmt = mantissa * (Decimal(1024) ** _BINARY[suffix]), "BinarySI"
    elif suffix in _DECIMAL:
        amount, fmt = mantissa.scaleb(_DECIMAL[suffix]), "DecimalSI"
    elif re.fullmatch(r"[eE][-+]?[0-9]+", suffix):
        amount, fmt = mantissa.scaleb(int(suffix[1:])), "DecimalExponent"
    else:
        raise ValueError("unable to parse quantity's suffix")
    return Quantity(amount.quantize(_NANO, rounding=ROUND_CEILING), fmt)


def _decimal_form(value: Decimal) -> tuple[int, int]:
    """(mantissa, exponent) with exponent a multiple of 3 and as large as keeps the mantissa whole."""
    sign, digits, exp = value.normalize().as_tuple()
    mantissa = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    assert isinstance(exp, int)
    if mantissa == 0:
        return 0, 0
    while exp % 3:
        mantissa, exp = mantissa * 10, exp - 1
    while mantissa % 1000 == 0 and exp < 18:
        mantissa, exp = mantissa // 1000, exp + 3
    return mantissa, exp


def canonical(value: Any) -> str:
    q = parse_quantity(value)
    whole = q.value == q.value.to_integral_value()
    if q.format == "BinarySI" and whole and abs(q.value) >= 1024:
        mantissa, power = int(q.value), 0
        while mantissa % 1024 == 0 and power < 6:
            mantissa, power = mantissa // 1024, power + 1
        suffix = next((s for s, p in _BINARY.items() if p == power), "")
        return f"{mantissa}{suffix}"
    mantissa, exp = _decimal_form(q.value)
    if q.format == "DecimalExponent":
        return f"{mantissa}e{exp}" if exp else str(mantissa)
    return f"{mantissa}{_DECIMAL_BY_EXP[exp]}"


def whole_units(value: Any) -> int:
    return int(parse_quantity(value).value.to_integral_value(rounding=ROUND_CEILING))
