#!/usr/bin/env python3
"""Resource use of every GPU kernel of a build, from the compiler itself.

    gpu-resources.py hip  BUILD_DIR [--out FILE]   # -Rpass-analysis=kernel-resource-usage (gfx9)
    gpu-resources.py cuda BUILD_DIR [--out FILE]   # ptxas -v (sm_90)

Recompiles the backend's kernel source (backends/<api>/<api>_kernels.cpp) with
the command in BUILD_DIR/compile_commands.json plus the compiler's resource
report, output discarded, and prints one Markdown table row per kernel
(docs/GPU.md keeps the current tables). Exits 1 on a spill to memory: CUDA
spill stores or loads, AMD VGPR spills (which go to scratch). AMD SGPR
spills (into VGPR lanes) and scratch that is not a spill (dynamically indexed
private arrays) are reported, not failed.
"""
import argparse
import json
import pathlib
import re
import shlex
import subprocess
import sys


def kernel_command(build, api):
    commands = json.loads((pathlib.Path(build) / "compile_commands.json").read_text())
    for entry in commands:
        if entry["file"].endswith(f"backends/{api}/{api}_kernels.cpp"):
            args = entry.get("arguments") or shlex.split(entry["command"])
            return entry["directory"], args
    sys.exit(f"gpu-resources: no backends/{api}/{api}_kernels.cpp in {build}/compile_commands.json "
             "(a build without the Kokkos kernels of that backend?)")


def without_outputs(args):
    """The compile command with its object and dependency outputs removed."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-MD", "-MMD"):
            continue
        out.append(a)
    return out


def demangle(names):
    if not names:
        return {}
    result = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, result.stdout.splitlines()))


KERNEL = re.compile(r"sparse_mla::kernels::(?:\w+::)*([A-Z]\w*)")


def template_arguments(text, start):
    """The balanced <...> starting at text[start], or "" when there is none."""
    if start >= len(text) or text[start] != "<":
        return ""
    depth = 0
    for i in range(start, len(text)):
        depth += {"<": 1, ">": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    return ""


def kernel_name(demangled):
    """Our functor's name, with its template arguments, inside Kokkos' launch wrapper."""
    m = KERNEL.search(demangled)
    if m:
        args = template_arguments(demangled, m.end())
        args = re.sub(r"Kokkos::(\w+::)*(\w+)", r"\2", args)
        args = re.sub(r"sparse_mla::kernels::(\w+::)*", "", args)
        args = re.sub(r"\((unsigned char|int|bool|long)\)", "", args)
        return m.group(1) + args
    if "Kokkos" in demangled:
        return "Kokkos internal: " + demangled.split("<")[0][:60]
    return demangled[:80]


def run(directory, command):
    result = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        sys.exit(f"gpu-resources: the compile failed ({result.returncode})")
    return result.stdout + result.stderr


def hip_report(build):
    directory, args = kernel_command(build, "hip")
    text = run(directory, without_outputs(args) + ["-Rpass-analysis=kernel-resource-usage", "-o", "/dev/null"])
    kernels, current = [], None
    for line in text.splitlines():
        m = re.search(r"remark: +(.*?) \[-Rpass-analysis=kernel-resource-usage\]", line)
        if not m:
            continue
        field = m.group(1).strip()
        if field.startswith("Function Name:"):
            current = {"mangled": field.split(":", 1)[1].strip()}
            kernels.append(current)
            continue
        if current is None or ":" not in field:
            continue
        key, value = field.rsplit(":", 1)
        current[key.strip()] = int(value.strip())
    names = demangle([k["mangled"] for k in kernels])
    rows, failures = [], []
    for k in kernels:
        name = kernel_name(names[k["mangled"]])
        row = (name, k.get("VGPRs", 0), k.get("AGPRs", 0), k.get("SGPRs", 0), k.get("ScratchSize [bytes/lane]", 0),
               k.get("LDS Size [bytes/block]", 0), k.get("Occupancy [waves/SIMD]", 0), k.get("VGPRs Spill", 0),
               k.get("SGPRs Spill", 0))
        rows.append(row)
        if row[7] > 0:
            failures.append(f"{name}: {row[7]} VGPRs spilled to scratch")
    header = ("kernel (gfx90a)", "VGPRs", "AGPRs", "SGPRs", "scratch B/lane", "LDS B", "occupancy", "VGPR spill",
              "SGPR spill")
    return header, rows, failures


def nvcc_wrapper(args):
    """Kokkos' nvcc_wrapper of the Kokkos the command includes: compile_commands.json names the host compiler,
    which Kokkos' launcher swaps for nvcc_wrapper when it builds. It is in bin/ of the installed Kokkos
    (<prefix>/include) or of the Kokkos source the project builds (<source>/core/src)."""
    for i, a in enumerate(args[:-1]):
        if a == "-isystem" and pathlib.Path(args[i + 1], "Kokkos_Core.hpp").exists():
            for top in list(pathlib.Path(args[i + 1]).parents)[:2]:
                wrapper = top / "bin" / "nvcc_wrapper"
                if wrapper.exists():
                    return str(wrapper)
    sys.exit("gpu-resources: no nvcc_wrapper beside the Kokkos headers of the compile command")


def cuda_report(build):
    directory, args = kernel_command(build, "cuda")
    if "nvcc" not in pathlib.Path(args[0]).name:
        args = [nvcc_wrapper(args)] + args[1:]
    text = run(directory, without_outputs(args) + ["-Xptxas", "-v", "-o", "/dev/null"])
    kernels, current = {}, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if m:
            current = kernels.setdefault(m.group(1), {"arch": m.group(2)})
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = kernels.get(m.group(1))
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current["stack"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(s.group(1)) if s else 0
    names = demangle(list(kernels))
    rows, failures = [], []
    for mangled, k in kernels.items():
        name = kernel_name(names[mangled])
        row = (name, k.get("registers", 0), k.get("stack", 0), k.get("spill_stores", 0), k.get("spill_loads", 0),
               k.get("smem", 0))
        rows.append(row)
        if row[3] or row[4]:
            failures.append(f"{name}: {row[3]} bytes of spill stores, {row[4]} of spill loads")
    header = ("kernel (sm_90)", "registers", "stack B", "spill stores B", "spill loads B", "static smem B")
    return header, rows, failures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("api", choices=["hip", "cuda"])
    parser.add_argument("build")
    parser.add_argument("--out", help="also write the table to this file")
    a = parser.parse_args()
    header, rows, failures = (hip_report if a.api == "hip" else cuda_report)(a.build)
    if not rows:
        sys.exit("gpu-resources: the compiler reported no kernel")
    rows.sort()
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if a.out:
        pathlib.Path(a.out).write_text(table + "\n")
    print(f"{len(rows)} kernels")
    for f in failures:
        print("spill:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
