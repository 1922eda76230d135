#!/usr/bin/env python3
"""Summarizes an `ncu --csv --metrics gpu__time_duration.sum` log of one
`moejit run --iters 1`: per kernel name, the duration of its last launch
(the last graph replay), in launch order, and their sum, in microseconds."""
import csv
import sys

rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1e3 if unit in ("nsecond", "ns") else v * 1e3 if unit in ("msecond", "ms") else v
    rows.append((r["Kernel Name"].split("(")[0], us))
# one layer = the last run of distinct names, in order
last = {}
order = []
for name, us in rows:
    if name not in last:
        order.append(name)
    last[name] = us
total = sum(last.values())
for name in order:
    print(f"{name} {last[name]:.1f}")
print(f"sum {total:.1f} us")
