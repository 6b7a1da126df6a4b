"""Stacked line charts as PNG with the standard library only (zlib), for benchmark plots where
matplotlib is not installed. Panels share the x axis; labels use a built-in 5x7 pixel font."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

Color = tuple[int, int, int]
BLUE, ORANGE, GREEN, RED, GRAY = (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), \
    (150, 150, 150)

_GLYPHS = {
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14),
    "2": (14, 17, 1, 2, 4, 8, 31), "3": (31, 2, 4, 2, 1, 17, 14),
    "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8),
    "8": (14, 17, 17, 14, 17, 17, 14), "9": (14, 17, 17, 15, 1, 2, 12),
    "A": (14, 17, 17, 31, 17, 17, 17), "B": (30, 17, 17, 30, 17, 17, 30),
    "C": (14, 17, 16, 16, 16, 17, 14), "D": (28, 18, 17, 17, 17, 18, 28),
    "E": (31, 16, 16, 30, 16, 16, 31), "F": (31, 16, 16, 30, 16, 16, 16),
    "G": (14, 17, 16, 23, 17, 17, 15), "H": (17, 17, 17, 31, 17, 17, 17),
    "I": (14, 4, 4, 4, 4, 4, 14), "J": (7, 2, 2, 2, 2, 18, 12),
    "K": (17, 18, 20, 24, 20, 18, 17), "L": (16, 16, 16, 16, 16, 16, 31),
    "M": (17, 27, 21, 21, 17, 17, 17), "N": (17, 17, 25, 21, 19, 17, 17),
    "O": (14, 17, 17, 17, 17, 17, 14), "P": (30, 17, 17, 30, 16, 16, 16),
    "Q": (14, 17, 17, 17, 21, 18, 13), "R": (30, 17, 17, 30, 20, 18, 17),
    "S": (15, 16, 16, 14, 1, 1, 30), "T": (31, 4, 4, 4, 4, 4, 4),
    "U": (17, 17, 17, 17, 17, 17, 14), "V": (17, 17, 17, 17, 17, 10, 4),
    "W": (17, 17, 17, 21, 21, 21, 10), "X": (17, 17, 10, 4, 10, 17, 17),
    "Y": (17, 17, 17, 10, 4, 4, 4), "Z": (31, 1, 2, 4, 8, 16, 31),
    " ": (0,) * 7, ".": (0, 0, 0, 0, 0, 12, 12), ",": (0, 0, 0, 0, 12, 4, 8),
    "-": (0, 0, 0, 31, 0, 0, 0), "(": (2, 4, 8, 8, 8, 4, 2), ")": (8, 4, 2, 2, 2, 4, 8),
    "/": (0, 1, 2, 4, 8, 16, 0), ":": (0, 12, 12, 0, 12, 12, 0), "=": (0, 0, 31, 0, 31, 0, 0),
    "%": (24, 25, 2, 4, 8, 19, 3),
}


@dataclass
class Series:
    """One line: (x, y) points, drawn as steps (a level held until the next point) or segments."""

    label: str
    points: Sequence[tuple[float, float]]
    color: Color
    steps: bool = False


@dataclass
class Panel:
    title: str
    series: list[Series] = field(default_factory=list)


class Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i:i + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, width: int = 1) -> None:
        """Bresenham's line, `width` pixels thick."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        while True:
            for ox in range(width):
                for oy in range(width):
                    self.dot(x0 + ox, y0 + oy, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: Color = (0, 0, 0), scale: int = 2) -> int:
        """Draw text with its top-left at (x, y); returns the x after it."""
        for ch in text.upper():
            rows = _GLYPHS.get(ch, _GLYPHS[" "])
            for r, bits in enumerate(rows):
                for c in range(5):
                    if bits >> (4 - c) & 1:
                        for ox in range(scale):
                            for oy in range(scale):
                                self.dot(x + c * scale + ox, y + r * scale + oy, color)
            x += 6 * scale
        return x

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[y * self.width * 3:(y + 1) * self.width * 3])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _nice_max(value: float) -> float:
    """A round axis top at or above `value`."""
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10
    for factor in (1, 2, 4, 8, 10):  # quarters of these are round too
        if value <= step * factor:
            return step * factor
    return value


def _fmt(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0") if value < 10 else f"{value:.0f}"


def write_chart(path: str, panels: list[Panel], x_label: str, width: int = 960,
                panel_height: int = 190) -> None:
    """Stacked panels over a shared x axis starting at 0, each with its own y axis from 0."""
    left, right, top, gap, bottom = 70, 20, 10, 50, 50
    height = top + len(panels) * (panel_height + gap) + bottom - gap + 20
    canvas = Canvas(width, height)
    x_max = _nice_max(max((x for p in panels for s in p.series for x, _ in s.points),
                          default=1.0))
    plot_w = width - left - right

    def px(x: float) -> int:
        return left + round(x / x_max * plot_w)

    for i, panel in enumerate(panels):
        y0 = top + i * (panel_height + gap) + 24  # below the title line
        h = panel_height - 24
        y_max = _nice_max(max((y for s in panel.series for _, y in s.points), default=1.0))

        def py(y: float, y0: int = y0, h: int = h, y_max: float = y_max) -> int:
            return y0 + h - round(y / y_max * h)

        x = canvas.text(left, y0 - 22, panel.title)
        for s in panel.series:  # legend after the title
            canvas.line(x + 16, y0 - 15, x + 36, y0 - 15, s.color, 3)
            x = canvas.text(x + 42, y0 - 22, s.label, s.color)
        for k in range(5):  # grid and y labels
            gy = py(y_max * k / 4)
            canvas.line(left, gy, width - right, gy, (225, 225, 225))
            label = _fmt(y_max * k / 4)
            canvas.text(left - 8 - 12 * len(label), gy - 7, label, GRAY)
        canvas.line(left, y0, left, y0 + h, (0, 0, 0))
        canvas.line(left, y0 + h, width - right, y0 + h, (0, 0, 0))
        for k in range(11):
            gx = px(x_max * k / 10)
            canvas.line(gx, y0 + h, gx, y0 + h + 4, (0, 0, 0))
            if i == len(panels) - 1:
                label = _fmt(x_max * k / 10)
                canvas.text(gx - 6 * len(label), y0 + h + 8, label, GRAY)
        for s in panel.series:
            pts = sorted(s.points)
            for (xa, ya), (xb, yb) in zip(pts, pts[1:], strict=False):
                if s.steps:
                    canvas.line(px(xa), py(ya), px(xb), py(ya), s.color, 2)
                    canvas.line(px(xb), py(ya), px(xb), py(yb), s.color, 2)
                else:
                    canvas.line(px(xa), py(ya), px(xb), py(yb), s.color, 2)
            if len(pts) == 1 or not s.steps:
                for xa, ya in pts:
                    canvas.line(px(xa) - 1, py(ya) - 1, px(xa) + 1, py(ya) + 1, s.color, 2)
    canvas.text(left + plot_w // 2 - 6 * len(x_label), height - 24, x_label)
    with open(path, "wb") as f:
        f.write(canvas.png())
