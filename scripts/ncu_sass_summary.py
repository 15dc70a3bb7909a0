#!/usr/bin/env python3
"""Summarizes an Nsight Compute source page exported as CSV (`ncu --import R.ncu-rep --page source --csv
--print-source sass`): the stall reasons' shares of all samples, the instructions grouped by how often
they ran (a loop body shows as many instructions with one execution count; count / launches / warps
gives its trips), and the instructions with the most stall samples. Used by scripts/gpu_profile_hopper.sh
(docs/PERFORMANCE.md, "Where the block-scaled kernels' time goes").

  scripts/ncu_sass_summary.py sass.csv [TOP]
"""
import collections
import csv
import sys


def main(path: str, top: int) -> None:
    rows = list(csv.reader(open(path, newline="")))
    # Row 0 names the kernel, row 1 is the header.
    hdr_at = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    hdr, data = rows[hdr_at], rows[hdr_at + 1:]
    ix = {h: i for i, h in enumerate(hdr)}
    samples_col = "Warp Stall Sampling (All Samples)"
    num = lambda r, c: float(r[ix[c]] or 0) if c in ix and r[ix[c]] else 0.0
    total = sum(num(r, samples_col) for r in data) or 1.0
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    agg = collections.Counter({s: sum(num(r, s) for r in data) for s in stalls})
    print(f"{path}: {len(data)} instructions, {total:.0f} samples")
    print("stall reasons:", ", ".join(f"{s[6:]} {v / total * 100:.1f}%" for s, v in agg.most_common(8)))
    by_count = collections.defaultdict(lambda: [0, 0.0, 0.0, collections.Counter()])
    executed = 0.0
    for r in data:
        e = num(r, "Instructions Executed")
        g = by_count[int(e)]
        g[0] += 1
        g[1] += e
        g[2] += num(r, samples_col)
        src = r[ix["Source"]].split()
        if src:
            op = src[1] if src[0].startswith("@") and len(src) > 1 else src[0]
            g[3][op.split(".")[0]] += 1
        executed += e
    print("instructions by execution count (a loop body shares one count):")
    for e, (n, ex, smp, ops) in sorted(by_count.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"  x{e:>11}: {n:5d} instructions, {ex / max(executed, 1) * 100:5.1f}% of executed, "
              f"{smp / total * 100:5.1f}% of samples; {', '.join(f'{o} {c}' for o, c in ops.most_common(6))}")
    print(f"top {top} instructions by stall samples:")
    ranked = sorted(range(len(data)), key=lambda i: -num(data[i], samples_col))[:top]
    for i in sorted(ranked):
        r = data[i]
        why = sorted(((num(r, s), s) for s in stalls), reverse=True)[:2]
        print(f"  {i:5d} {num(r, samples_col) / total * 100:5.1f}% x{int(num(r, 'Instructions Executed')):>10} "
              f"{r[ix['Source']][:64]:64s} " + ", ".join(f"{s[6:]} {v / total * 100:.1f}%" for v, s in why))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
