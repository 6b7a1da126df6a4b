"""The form in which the API server stores a resource quantity: a client writes "1000m" and reads
back "1", writes "4096Mi" and reads "4Gi".

Follows k8s.io/apimachinery/pkg/api/resource: quantity.go (parseQuantityString, ParseQuantity
with its rounding up to nano units and its BinarySI-below-one rule, CanonicalizeBytes),
amount.go (AsCanonicalBytes: factors of ten moved into an exponent that is a multiple of three;
AsCanonicalBase1024Bytes) and suffix.go (the suffix tables). A quantity field of a built-in type
is decoded into a Quantity and encoded with String(), so every write is stored canonically.
Values beyond the E suffix are refused here rather than modelled.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

# parseQuantityString: sign, digits, an optional fraction, then a suffix of these letters and
# an optional signed exponent.
_FORM = re.compile(r"^([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)$")
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_EXPONENT = re.compile(r"^[eE]([-+]?[0-9]+)$")
_NANO = 10 ** 9
_MAX_ALLOWED = 2 ** 63 - 1  # ParseQuantity caps BinarySI amounts here
DECIMAL_SI, BINARY_SI, DECIMAL_EXPONENT = "DecimalSI", "BinarySI", "DecimalExponent"


def parse(text: str | int | float) -> tuple[Fraction, str]:
    """(value, format) as ParseQuantity reads it; ValueError for what it refuses. A JSON number
    is read from its text, as Quantity.UnmarshalJSON does."""
    match = _FORM.match(str(text))
    if not match or not (match[2] or match[3]):
        raise ValueError(f"{text!r}: quantities must match the regular expression "
                         "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    sign, whole, fraction, suffix = match[1], match[2], match[3] or "", match[4]
    amount = Fraction(int(whole or "0")) + Fraction(int(fraction or "0"), 10 ** len(fraction))
    if suffix in _DECIMAL:
        amount, form = amount * Fraction(10) ** _DECIMAL[suffix], DECIMAL_SI
    elif suffix in _BINARY:
        amount, form = amount * 2 ** _BINARY[suffix], BINARY_SI
    elif exponent := _EXPONENT.match(suffix):
        amount, form = amount * Fraction(10) ** int(exponent[1]), DECIMAL_EXPONENT
    else:
        raise ValueError(f"{text!r}: unable to parse quantity's suffix")
    if amount:  # rounded up to the smallest unit, so a tiny request is never zero
        amount = Fraction(math.ceil(amount * _NANO), _NANO)
    if form == BINARY_SI:
        amount = min(amount, Fraction(_MAX_ALLOWED))
        form = DECIMAL_SI if 0 < amount < 1 else form
    return (-amount if sign == "-" else amount), form


def _decimal(value: Fraction) -> tuple[int, int]:
    """(mantissa, exponent) with every factor of ten in the exponent, then the exponent lowered
    to a multiple of three (AsCanonicalBytes)."""
    mantissa, exponent = int(value * _NANO), -9  # exact: parse rounded to nano units
    while mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    while exponent % 3:
        mantissa, exponent = mantissa * 10, exponent - 1
    return mantissa, exponent


def _binary(value: int) -> tuple[int, int]:
    """(mantissa, power of 1024) with every factor of 1024 in the power."""
    power = 0
    while value % 1024 == 0:
        value, power = value // 1024, power + 1
    return value, power


def canonical(text: str | int | float) -> str:
    """What the API server stores for this quantity (Quantity.String())."""
    value, form = parse(text)
    if value == 0:
        return "0"
    if form == BINARY_SI and (-1024 < value < 1024 or value.denominator != 1):
        form = DECIMAL_SI  # BinarySI only where it is exact and at least 1Ki
    if form == BINARY_SI:
        mantissa, power = _binary(int(value))
        return f"{mantissa}{list(_BINARY)[power - 1] if power else ''}"
    mantissa, exponent = _decimal(value)
    if form == DECIMAL_EXPONENT:
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    suffix = {v: k for k, v in _DECIMAL.items()}.get(exponent)
    if suffix is None:
        raise ValueError(f"{text!r}: beyond the E suffix")
    return f"{mantissa}{suffix}"
