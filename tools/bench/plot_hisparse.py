#!/usr/bin/env python3
"""The HiSparse hit-rate sweep of `sparse-mla bench`, as a table and a PNG.

    sparse-mla bench --backend cuda --filter '^model-step/' --json-file model-step.json
    python3 tools/bench/plot_hisparse.py model-step.json --png hisparse-sweep.png

Reads the `model-step/rows=R,hits=P` cases of one or more bench JSON files
(bench --json or --json-file) and prints, per batch size and hit rate, the
decode step's HiSparse time (resolve once per index group, gather per layer),
the time its missed bytes take at the pinned copy ceiling of the same run
(`at_ceiling_us`: the floor) and the difference: the bookkeeping the library adds to the
transfer that no implementation can avoid. With --png it draws the same
figures: milliseconds per step against hit rate, one colour per batch size,
the step solid and the floor dashed, on a logarithmic axis.

The PNG is drawn here (a small rasteriser and the PNG format from zlib), so
the script needs nothing beyond the standard library.
"""
import argparse
import json
import math
import re
import struct
import sys
import zlib

CASE = re.compile(r"^model-step/rows=(\d+),hits=(\d+)$")
GROUPS = 16  # index groups of the model-step cases (61 layers, a new group every 4)


def read_cases(paths):
    """{(rows, hits): case} over the files, and the device name of the first."""
    cases, device = {}, ""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"plot_hisparse: cannot read {path}: {e}")
        if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
            sys.exit(f"plot_hisparse: {path} is not the JSON of sparse-mla bench (no 'cases' list)")
        device = device or f"{doc.get('device', {}).get('name', '?')} ({doc.get('device', {}).get('backend', '?')})"
        for case in doc["cases"]:
            match = CASE.match(str(case.get("name", "")))
            if match and case.get("timed") and str(case.get("outcome", "")).startswith("ok"):
                cases[(int(match.group(1)), int(match.group(2)))] = case
    if not cases:
        sys.exit("plot_hisparse: no timed model-step case in " + ", ".join(paths) +
                 " (run sparse-mla bench --filter '^model-step/')")
    return cases, device


def table(cases):
    lines = ["| rows | hits | step us | floor us (missed bytes at the pinned ceiling) | bookkeeping us | per index group us |",
             "|---|---|---|---|---|---|"]
    for (rows, hits), c in sorted(cases.items()):
        step, floor = c["median_us"], c.get("at_ceiling_us", 0.0)
        lines.append(f"| {rows} | {hits}% | {step:.1f} | {floor:.1f} | {step - floor:.1f} | {(step - floor) / GROUPS:.2f} |")
    return "\n".join(lines)


# A 5 x 7 font: each glyph is 7 rows of 5 bits; letters are drawn upper case.
FONT = {
    "0": "01110 10001 10011 10101 11001 10001 01110", "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111", "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010", "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110", "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110", "9": "01110 10001 10001 01111 00001 00010 01100",
    "A": "01110 10001 10001 11111 10001 10001 10001", "B": "11110 10001 10001 11110 10001 10001 11110",
    "C": "01110 10001 10000 10000 10000 10001 01110", "D": "11100 10010 10001 10001 10001 10010 11100",
    "E": "11111 10000 10000 11110 10000 10000 11111", "F": "11111 10000 10000 11110 10000 10000 10000",
    "G": "01110 10001 10000 10111 10001 10001 01111", "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110", "J": "00111 00010 00010 00010 00010 10010 01100",
    "K": "10001 10010 10100 11000 10100 10010 10001", "L": "10000 10000 10000 10000 10000 10000 11111",
    "M": "10001 11011 10101 10101 10001 10001 10001", "N": "10001 10001 11001 10101 10011 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110", "P": "11110 10001 10001 11110 10000 10000 10000",
    "Q": "01110 10001 10001 10001 10101 10010 01101", "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110", "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110", "V": "10001 10001 10001 10001 10001 01010 00100",
    "W": "10001 10001 10001 10101 10101 10101 01010", "X": "10001 10001 01010 00100 01010 10001 10001",
    "Y": "10001 10001 10001 01010 00100 00100 00100", "Z": "11111 00001 00010 00100 01000 10000 11111",
    ".": "00000 00000 00000 00000 00000 01100 01100", ",": "00000 00000 00000 00000 01100 00100 01000",
    "%": "11000 11001 00010 00100 01000 10011 00011", "(": "00010 00100 01000 01000 01000 00100 00010",
    ")": "01000 00100 00010 00010 00010 00100 01000", "=": "00000 00000 11111 00000 11111 00000 00000",
    "/": "00000 00001 00010 00100 01000 10000 00000", "-": "00000 00000 00000 11111 00000 00000 00000",
    ":": "00000 01100 01100 00000 01100 01100 00000", "+": "00000 00100 00100 11111 00100 00100 00000",
}
COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (140, 86, 75)]


class Canvas:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x, y, colour):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i:i + 3] = bytes(colour)

    def box(self, x0, y0, x1, y1, colour):
        for y in range(max(0, y0), min(self.height, y1 + 1)):
            for x in range(max(0, x0), min(self.width, x1 + 1)):
                self.dot(x, y, colour)

    def line(self, x0, y0, x1, y1, colour, width=1, dash=0):
        """A straight line `width` pixels thick; dash > 0 draws dash pixels on, dash off."""
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            if dash and (i // dash) % 2:
                continue
            x = round(x0 + (x1 - x0) * i / steps)
            y = round(y0 + (y1 - y0) * i / steps)
            self.box(x - width // 2, y - width // 2, x + (width - 1) // 2, y + (width - 1) // 2, colour)

    def text(self, x, y, text, colour=(0, 0, 0), scale=2):
        for ch in text.upper():
            glyph = FONT.get(ch)
            if glyph:
                for row, bits in enumerate(glyph.split()):
                    for col, bit in enumerate(bits):
                        if bit == "1":
                            self.box(x + col * scale, y + row * scale, x + (col + 1) * scale - 1, y + (row + 1) * scale - 1,
                                     colour)
            x += 6 * scale

    @staticmethod
    def text_width(text, scale=2):
        return 6 * scale * len(text)

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width]) for y in range(self.height))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def plot(cases, device, width=900, height=600):
    canvas = Canvas(width, height)
    left, right, top, bottom = 90, width - 230, 85, height - 80
    hit_rates = sorted({hits for _, hits in cases})
    batches = sorted({rows for rows, _ in cases})
    values = [c["median_us"] / 1e3 for c in cases.values()] + [c.get("at_ceiling_us", 0) / 1e3 for c in cases.values()]
    values = [v for v in values if v > 0]
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    high = max(high, low + 1)

    def x_of(hits):  # hit rates as evenly spaced categories
        i = hit_rates.index(hits)
        return left + (right - left) * (i + 0.5) / len(hit_rates)

    def y_of(ms):
        return bottom - (bottom - top) * (math.log10(ms) - low) / (high - low)

    canvas.text(left, 12, "HiSparse, one decode step: 61 layers, 16 index groups")
    canvas.text(left, 34, f"K=2048, H=4096, {device}"[:64], (90, 90, 90))
    canvas.text(left - 60, top - 26, "ms per step (log)", (60, 60, 60))
    for decade in range(low, high + 1):
        for mantissa in (1, 2, 5):
            ms = mantissa * 10.0 ** decade
            if decade == high and mantissa > 1:
                continue
            y = round(y_of(ms))
            canvas.line(left, y, right, y, (225, 225, 225) if mantissa > 1 else (190, 190, 190))
            label = f"{ms:g}"
            canvas.text(left - 10 - Canvas.text_width(label), y - 7, label, (60, 60, 60))
    for hits in hit_rates:
        x = round(x_of(hits))
        canvas.line(x, bottom, x, bottom + 6, (0, 0, 0))
        canvas.text(x - Canvas.text_width(f"{hits}%") // 2, bottom + 14, f"{hits}%")
    canvas.line(left, bottom, right, bottom, (0, 0, 0), 2)
    canvas.line(left, top, left, bottom, (0, 0, 0), 2)
    canvas.text((left + right) // 2 - Canvas.text_width("hit rate") // 2, bottom + 44, "hit rate")
    for n, rows in enumerate(batches):
        colour = COLOURS[n % len(COLOURS)]
        for key, dash in (("median_us", 0), ("at_ceiling_us", 8)):
            points = [(round(x_of(h)), round(y_of(cases[(rows, h)].get(key, 0) / 1e3)))
                      for h in hit_rates if (rows, h) in cases and cases[(rows, h)].get(key, 0) > 0]
            for (xa, ya), (xb, yb) in zip(points, points[1:]):
                canvas.line(xa, ya, xb, yb, colour, 3, dash)
            for x, y in points:
                canvas.box(x - 4, y - 4, x + 4, y + 4, colour)
        y = top + 10 + 50 * n
        canvas.line(right + 20, y, right + 60, y, colour, 3)
        canvas.text(right + 70, y - 7, f"rows={rows} step")
        canvas.line(right + 20, y + 20, right + 60, y + 20, colour, 3, 8)
        canvas.text(right + 70, y + 13, "floor", colour)
    canvas.text(right + 20, top + 10 + 50 * len(batches), "floor: missed", (60, 60, 60))
    canvas.text(right + 20, top + 30 + 50 * len(batches), "bytes at the", (60, 60, 60))
    canvas.text(right + 20, top + 50 + 50 * len(batches), "pinned ceiling", (60, 60, 60))
    return canvas.png()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="sparse-mla bench JSON (--json or --json-file)")
    parser.add_argument("--png", help="write the plot here")
    args = parser.parse_args()
    cases, device = read_cases(args.json)
    print(f"HiSparse per decode step on {device}: 61 layers in 16 index groups, K=2048, H=4096")
    print(table(cases))
    if args.png:
        with open(args.png, "wb") as f:
            f.write(plot(cases, device))
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
