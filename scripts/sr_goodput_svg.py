#!/usr/bin/env python3
"""Plots the markdown table `sr_goodput` prints (stdin) as an SVG (stdout):
goodput relative to lossless vs loss rate, go-back-N, selective repeat and
the go-back-N formula. With a file argument holding the table
`scripts/sr_netns_bench.sh` prints (real UDP between namespaces), its two
ratios are drawn too (thin lines). No dependencies beyond Python 3.

cargo run --release -p softrdma-engine --example sr_goodput | python3 scripts/sr_goodput_svg.py [UDP_TABLE] > docs/sr_goodput.svg
"""
import sys

udp = []
if len(sys.argv) > 1:
    for line in open(sys.argv[1]):
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) >= 7 and c[0].endswith("%"):
            udp.append((float(c[0].rstrip(" %")), float(c[2]), float(c[5])))

rows = []
for line in sys.stdin:
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) >= 8 and c[0].endswith("%"):
        rows.append((float(c[0].rstrip(" %")), float(c[2]), float(c[3]), float(c[6])))
W, H, L, T, R, B = 560, 360, 60, 30, 170, 50
pw, ph = W - L - R, H - T - B
xs = [i * pw / (len(rows) - 1) for i in range(len(rows))]
top = max([1.0] + [max(r[1], r[2]) for r in udp])
top = 1.0 if top <= 1.0 else (int(top * 4) + 1) / 4
y = lambda v: T + ph * (1 - v / top)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{L}" y="18">RC WRITE goodput / lossless: simulator (100 Gb/s, 10 µs RTT){" and UDP namespaces" if udp else ""}</text>']
for v in [i * 0.25 for i in range(int(top * 4) + 1)]:
    out.append(f'<line x1="{L}" x2="{L+pw}" y1="{y(v)}" y2="{y(v)}" stroke="#ddd"/>')
    out.append(f'<text x="{L-8}" y="{y(v)+4}" text-anchor="end">{v:.2f}</text>')
for x, r in zip(xs, rows):
    out.append(f'<text x="{L+x}" y="{T+ph+18}" text-anchor="middle">{r[0]:g} %</text>')
out.append(f'<text x="{L+pw/2}" y="{H-8}" text-anchor="middle">random loss per packet</text>')
series = [(rows, 1, "go-back-N", "#c0392b", ""), (rows, 2, "GBN formula", "#888", ' stroke-dasharray="5,4"'), (rows, 3, "selective repeat", "#2471a3", "")]
if udp:
    series += [(udp, 1, "GBN, UDP netns", "#e59866", ' stroke-dasharray="2,3"'), (udp, 2, "SR, UDP netns", "#7fb3d5", ' stroke-dasharray="2,3"')]
for k, (data, col, name, color, dash) in enumerate(series):
    pts = " ".join(f"{L+x:.1f},{y(r[col]):.1f}" for x, r in zip(xs, data))
    out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
    for x, r in zip(xs, data):
        out.append(f'<circle cx="{L+x:.1f}" cy="{y(r[col]):.1f}" r="3" fill="{color}"/>')
    ly = T + 20 + k * 20
    out.append(f'<line x1="{L+pw+15}" x2="{L+pw+40}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>')
    out.append(f'<text x="{L+pw+45}" y="{ly+4}">{name}</text>')
out.append("</svg>")
print("\n".join(out))
