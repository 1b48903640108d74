#!/usr/bin/env python3
"""Plots the markdown table `sr_goodput` prints (stdin) as an SVG (stdout):
goodput relative to lossless vs loss rate, go-back-N, selective repeat and
the go-back-N formula. No dependencies beyond Python 3.

cargo run --release -p softrdma-engine --example sr_goodput | python3 scripts/sr_goodput_svg.py > docs/sr_goodput.svg
"""
import sys

rows = []
for line in sys.stdin:
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) >= 8 and c[0].endswith("%"):
        rows.append((float(c[0].rstrip(" %")), float(c[2]), float(c[3]), float(c[6])))
W, H, L, T, R, B = 560, 360, 60, 30, 170, 50
pw, ph = W - L - R, H - T - B
xs = [i * pw / (len(rows) - 1) for i in range(len(rows))]
y = lambda v: T + ph * (1 - v)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{L}" y="18">RC WRITE goodput / lossless, 100 Gb/s, 10 µs RTT (simulator)</text>']
for v in [0, 0.25, 0.5, 0.75, 1.0]:
    out.append(f'<line x1="{L}" x2="{L+pw}" y1="{y(v)}" y2="{y(v)}" stroke="#ddd"/>')
    out.append(f'<text x="{L-8}" y="{y(v)+4}" text-anchor="end">{v:.2f}</text>')
for x, r in zip(xs, rows):
    out.append(f'<text x="{L+x}" y="{T+ph+18}" text-anchor="middle">{r[0]:g} %</text>')
out.append(f'<text x="{L+pw/2}" y="{H-8}" text-anchor="middle">random loss per packet</text>')
series = [(1, "go-back-N", "#c0392b", ""), (2, "GBN formula", "#888", ' stroke-dasharray="5,4"'), (3, "selective repeat", "#2471a3", "")]
for k, (col, name, color, dash) in enumerate(series):
    pts = " ".join(f"{L+x:.1f},{y(r[col]):.1f}" for x, r in zip(xs, rows))
    out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
    for x, r in zip(xs, rows):
        out.append(f'<circle cx="{L+x:.1f}" cy="{y(r[col]):.1f}" r="3" fill="{color}"/>')
    ly = T + 20 + k * 20
    out.append(f'<line x1="{L+pw+15}" x2="{L+pw+40}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
    out.append(f'<text x="{L+pw+45}" y="{ly+4}">{name}</text>')
out.append("</svg>")
print("\n".join(out))
