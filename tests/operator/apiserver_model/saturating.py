"""Cost arithmetic as cel-go does it (common/cost.go): uint64 that saturates instead of
overflowing, so an unbounded estimate stays the largest one."""

from __future__ import annotations

import math

U64 = 2**64 - 1


def add(*xs: int) -> int:
    return min(sum(xs), U64)


def mul(x: int, y: int) -> int:
    return min(x * y, U64)


def by_factor(x: int, f: float) -> int:
    product = math.ceil(float(x) * f)
    return U64 if product >= 2**64 else product
