#!/usr/bin/env python3
"""Checks that the commands in the README and docs/ parse as written.

Every `cargo run --release -p fornax -- ARGS` or `fornax ARGS` line of a shell code block
runs as `FORNAX ARGS --help`: clap checks each subcommand and flag up to `--help`, then
prints the help and exits 0, so a renamed flag or subcommand fails here without running
anything. Every `scripts/NAME` a block starts with must be an executable file.
usage: scripts/check-readme.py [FORNAX]   (default target/release/fornax)
"""

import glob
import os
import re
import shlex
import subprocess
import sys

FORNAX = sys.argv[1] if len(sys.argv) > 1 else "target/release/fornax"
PREFIXES = ["cargo run --release -p fornax -- ", "fornax "]


def shell_lines(path):
    """(line number, text) of each line inside the shell code blocks of `path`."""
    inside = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            inside = not inside and fence.group(1) in ("sh", "bash", "")
            continue
        if inside:
            yield n, line.strip()


def main():
    failures, checked = [], 0
    for path in ["README.md"] + sorted(glob.glob("docs/*.md")):
        for n, line in shell_lines(path):
            where = f"{path}:{n}"
            prefix = next((p for p in PREFIXES if line.startswith(p)), None)
            if prefix:
                args = shlex.split(line[len(prefix):], comments=True)
                run = subprocess.run(
                    [FORNAX, *args, "--help"], capture_output=True, text=True, timeout=60
                )
                checked += 1
                if run.returncode != 0:
                    failures.append(f"{where}: {line}\n  {run.stderr.strip()}")
            elif line.startswith("scripts/"):
                script = line.split()[0]
                checked += 1
                if not (os.path.isfile(script) and os.access(script, os.X_OK)):
                    failures.append(f"{where}: {script} is not an executable script")
    for f in failures:
        print(f)
    if failures:
        sys.exit(1)
    print(f"check-readme: {checked} commands in the README and docs/ parse")


if __name__ == "__main__":
    main()
