#!/usr/bin/env python3
"""Where a team kernel's instructions go, from Nsight Compute's source page.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > kernel.csv
    python3 tools/ci/ncu-passes.py kernel.csv [--rows N] [--top K]

The kernels of core/kernels/ run in passes that end at a team barrier
(BAR.SYNC), so the SASS, in address order, splits at those instructions
into passes (code that the compiler placed out of order, such as a loop's
cold path, counts in the pass it sits in). For each pass
the table gives the warp instructions executed (divided by --rows, the
teams of the profiled launch: a figure per row), its share, its stall
samples and its most executed opcodes; then the stall reasons over the
whole kernel. With --top K the K most executed instructions follow.
tools/ci/gpu-profile.sh runs it.
"""
import argparse
import collections
import csv
import sys


def opcode(sass):
    """'@!P1 LDG.E.U16 R17, [R14.64]' -> 'LDG'."""
    words = sass.split()
    if not words:
        return "?"
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def read(path):
    """The header row and the instruction rows of the CSV's one kernel (the
    kernel-name line that ncu writes first is skipped; a second kernel is
    refused: profile one launch)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, row in enumerate(rows):
        if "Address" in row and "Source" in row and "Instructions Executed" in row:
            body = rows[i + 1:]
            if any(r and r[0] == "Kernel Name" for r in body):
                raise ValueError(f"{path}: more than one kernel (profile one launch: ncu --launch-count 1)")
            # Lines that are not instructions (an ncu warning among them) are left out.
            return row, [r for r in body if len(r) == len(row)]
    raise ValueError(f"{path}: no header with 'Address', 'Source' and 'Instructions Executed' "
                     "(write it with: ncu -i REPORT --page source --csv --print-source sass)")


def number(text):
    try:
        return int(float(text or 0))
    except ValueError:
        return 0


def summarise(header, rows, teams, top):
    col = {name: i for i, name in enumerate(header)}
    samples_col = col.get("Warp Stall Sampling (All Samples)")
    stall_cols = [n for n in header if n.startswith("stall_") and "Not Issued" not in n]
    passes = []  # [instructions, samples, opcodes, ending instruction]
    current = [0, 0, collections.Counter(), "(end of kernel)"]
    stalls = collections.Counter()
    hottest = []
    for row in rows:
        sass = row[col["Source"]].strip()
        executed = number(row[col["Instructions Executed"]])
        current[0] += executed
        current[1] += number(row[samples_col]) if samples_col is not None else 0
        op = opcode(sass)
        current[2][op] += executed
        for name in stall_cols:
            stalls[name[len("stall_"):]] += number(row[col[name]])
        hottest.append((executed, sass))
        if op == "BAR":  # a team barrier ends the pass
            current[3] = sass
            passes.append(current)
            current = [0, 0, collections.Counter(), "(end of kernel)"]
    if current[0]:
        passes.append(current)
    total = sum(p[0] for p in passes)
    if total == 0:
        raise ValueError("no instruction was executed (was the report's kernel launched?)")
    out = []
    out.append(f"warp instructions per row: {total / teams:,.0f} (teams: {teams})")
    out.append("")
    out.append("| pass | ends at | warp instructions per row | share | stall samples | top opcodes |")
    out.append("|---|---|---|---|---|---|")
    for i, (executed, samples, ops, end) in enumerate(passes):
        if executed == 0:
            continue
        tops = ", ".join(f"{op} {n / teams:,.0f}" for op, n in ops.most_common(5))
        out.append(f"| {i} | `{end.split(',')[0]}` | {executed / teams:,.0f} | {100 * executed / total:.1f}% | "
                   f"{samples} | {tops} |")
    sampled = sum(stalls.values())
    if sampled:
        out.append("")
        reasons = ", ".join(f"{name} {100 * n / sampled:.0f}%" for name, n in stalls.most_common(10) if n)
        out.append(f"stall samples ({sampled}): {reasons}")
    if top:
        out.append("")
        out.append("most executed instructions (warp instructions per row):")
        for executed, sass in sorted(hottest, key=lambda x: -x[0])[:top]:
            out.append(f"  {executed / teams:10,.1f}  {sass}")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--rows", type=int, default=1, help="teams of the profiled launch (default 1)")
    parser.add_argument("--top", type=int, default=0, help="also list the K most executed instructions")
    args = parser.parse_args()
    if args.rows < 1:
        parser.error(f"--rows must be at least 1, got {args.rows}")
    try:
        header, rows = read(args.csv)
        print(summarise(header, rows, args.rows, args.top))
    except (OSError, ValueError, KeyError) as e:
        print(f"ncu-passes: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
