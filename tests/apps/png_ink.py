#!/usr/bin/python3
"""Counts the pixels of a PNG screenshot that differ from its background colour.

Used by the report's browser test to tell a page whose charts drew from a blank one.
Standard library only: decodes 8-bit RGB/RGBA, non-interlaced PNGs (what Chromium
writes for --screenshot), undoing the per-row filters of the PNG specification.
Prints JSON {"width", "height", "background", "ink", "ink_fraction", "colour_fraction"}:
ink is every pixel unlike the background; colour only the saturated ones (max - min
channel > 80) — chart strokes and the heatmap, not text, grey panels or pale boxes.
Exits 1 on a file that is not such a PNG.
"""
import json
import struct
import sys
import zlib
from collections import Counter


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                raise ValueError("unsupported PNG (depth %d, colour type %d)" % (depth, colour))
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    if width is None:
        raise ValueError("no IHDR chunk")
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def main():
    try:
        width, height, bpp, rows = decode(sys.argv[1])
    except (OSError, ValueError, zlib.error, struct.error) as e:
        print("png_ink.py: %s: %s" % (sys.argv[1], e), file=sys.stderr)
        return 1
    pixels = Counter()
    for line in rows:
        for i in range(0, len(line), bpp):
            pixels[bytes(line[i:i + 3])] += 1
    background, count = pixels.most_common(1)[0]
    ink = width * height - count
    colour = sum(n for rgb, n in pixels.items() if max(rgb) - min(rgb) > 80)
    total = float(width * height)
    print(json.dumps({"width": width, "height": height, "background": background.hex(), "ink": ink,
                      "ink_fraction": ink / total, "colour_fraction": colour / total}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
