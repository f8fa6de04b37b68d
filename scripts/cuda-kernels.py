#!/usr/bin/env python3
"""The CUDA kernels a run compiled, assembled for each target: registers per thread,
shared memory (static and dynamic), spills and the occupancy that follows.

Input: cubecl's compilation log at level "full" (the CUDA C++ of every kernel a process
compiled, with its id; `scripts/gpu-check.sh` turns it on with a `cubecl.toml`). Each
distinct source is compiled with `nvcc -cubin -Xptxas -v` for every `--arch` (in parallel)
and the table goes to stdout; with `--out DIR`, each compiler's output goes to DIR too.
A kernel that does not compile is listed with the compiler's first error and makes the
exit status 1.

Usage: scripts/cuda-kernels.py KERNELS.log [--arch sm_80 --arch sm_90a] [--out DIR]
"""

import argparse
import concurrent.futures
import hashlib
import os
import re
import subprocess
import sys
import tempfile

# Per multiprocessor, by compute capability major version: registers, threads, blocks,
# shared memory (bytes, what one block may take) and the register allocation unit (per
# warp). From the CUDA programming guide's table of technical specifications.
LIMITS = {
    8: dict(regs=65536, threads=2048, blocks=32, smem=167936, reg_unit=256),
    9: dict(regs=65536, threads=2048, blocks=32, smem=233472, reg_unit=256),
}

BLOCK = re.compile(r"\[START_KERNEL_COMPILATION\](.*?)\[END_KERNEL_COMPILATION\]", re.S)


def kernels(log):
    """(name, threads per block, source) for each distinct source in the log."""
    seen, out = set(), []
    for block in BLOCK.findall(log):
        name = re.search(r"^name: (.*?)\nid:", block, re.M | re.S)
        source = re.search(r"source:\n```[a-z]*\n(.*)\n```", block, re.S)
        if not source:
            continue
        source = source.group(1)
        digest = hashlib.sha256(source.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        dims = [re.search(rf"\b{axis}: (\d+)", block.split("cube_dim", 1)[-1]) for axis in "xyz"]
        threads = 1
        for dim in dims:
            threads *= int(dim.group(1)) if dim else 1
        # The kernel type's last path segment, without its generic arguments.
        label = name.group(1).split("<")[0].split("::")[-1].strip() if name else "kernel"
        out.append((label, threads, source, digest[:12], dynamic_shared(source)))
    return out


def dynamic_shared(source):
    """Bytes of the dynamic shared memory cubecl declares (each shared array or value is
    an offset into one `extern __shared__` buffer, with its size in a comment above)."""
    pairs = re.findall(
        r"// Shared (?:array|value) size: (?:\d+, )?(\d+) bytes\s*\n[^\n]*dynamic_shared_mem\[(\d+)\]",
        source)
    return max((int(size) + int(offset) for size, offset in pairs), default=0)


def compile_one(nvcc, arch, source, digest, folder):
    path = os.path.join(folder, f"{digest}.cu")
    with open(path, "w") as f:
        f.write(source)
    cmd = [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-lineinfo", "-o",
           os.path.join(folder, f"{digest}_{arch}.cubin"), path]
    run = subprocess.run(cmd, capture_output=True, text=True)
    text = run.stdout + run.stderr
    if run.returncode != 0:
        first = next((l for l in text.splitlines() if "error" in l), text.strip()[:200])
        first = first or f"{nvcc} exited with {run.returncode}"
        return dict(ok=False, error=first.strip(), text=text)
    regs = re.findall(r"Used (\d+) registers", text)
    smem = re.findall(r"(\d+) bytes smem", text)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    stack = re.findall(r"(\d+) bytes stack frame", text)
    return dict(
        ok=True,
        regs=max(map(int, regs), default=0),
        smem=max(map(int, smem), default=0),
        spill=max((int(s) + int(l) for s, l in spill), default=0),
        stack=max(map(int, stack), default=0),
        text=text,
    )


def occupancy(arch, threads, regs, smem):
    """Resident warps per multiprocessor over the maximum, as a fraction."""
    limits = LIMITS.get(int(re.sub(r"\D", "", arch)[:-1] or 0))
    if not limits or threads == 0:
        return None
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // limits["reg_unit"]) * limits["reg_unit"]
    by_regs = limits["regs"] // (per_warp * warps)
    by_threads = limits["threads"] // (warps * 32)
    by_smem = limits["smem"] // smem if smem else limits["blocks"]
    blocks = min(by_regs, by_threads, by_smem, limits["blocks"])
    return blocks * warps / (limits["threads"] // 32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--arch", action="append", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    args = parser.parse_args()
    archs = args.arch or ["sm_80", "sm_90a"]
    found = kernels(open(args.log, errors="replace").read())
    if not found:
        print(f"no kernel sources in {args.log} (all loaded from the kernel cache?)")
        return 1
    folder = args.out or tempfile.mkdtemp(prefix="cuda-kernels-")
    os.makedirs(folder, exist_ok=True)
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for label, threads, source, digest, _ in found:
            for arch in archs:
                jobs[(digest, arch)] = pool.submit(
                    compile_one, args.nvcc, arch, source, digest, folder)
    failed = 0
    head = "| kernel | threads/block |" + "".join(
        f" {a} regs | {a} smem B | {a} spill B | {a} occupancy |" for a in archs)
    print(head)
    print("|" + " --- |" * (2 + 4 * len(archs)))
    for label, threads, source, digest, dynamic in sorted(found, key=lambda k: k[0]):
        row = f"| {label} ({digest[:8]}) | {threads} |"
        for arch in archs:
            r = jobs[(digest, arch)].result()
            with open(os.path.join(folder, f"{digest}_{arch}.txt"), "w") as f:
                f.write(r["text"])
            if not r["ok"]:
                failed += 1
                row += f" error: {r['error'][:80]} | | | |"
                continue
            smem = r["smem"] + dynamic
            occ = occupancy(arch, threads, r["regs"], smem)
            row += (f" {r['regs']} | {smem} | {r['spill']} |"
                    f" {'' if occ is None else f'{occ:.0%}'} |")
        print(row)
    print(f"\n{len(found)} kernels, {len(archs)} targets, {failed} failed compiles; "
          f"sources and compiler output in {folder}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
