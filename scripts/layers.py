#!/usr/bin/env python3
"""Hold the front ends to their layer (CI runs this from scripts/test.sh).

The command line (crates/cli) and the Python package (crates/py) map
options onto the library's jobs and say what they return; how a job is
resumed, recorded or released, how an exNode is saved, and how a depot is
spoken to live in the library (ARCHITECTURE.md, "Invariants"). So their
sources outside tests name none of:

- `leftover::` (the records of unfinished jobs: `lors::job` keeps them),
- `by_depot` (the library's per-depot runner),
- `Connection` from `lors_ibp` or `lors_ibp::client` (raw IBP: the pool and
  the jobs talk to depots),
- `xnd::save` (saving an exNode is part of a job) — except at the sites
  listed in SAVE_SITES, which save what no job made.

Usage: scripts/layers.py
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FRONTS = ["crates/cli/src", "crates/py/src"]

RULES = [
    (re.compile(r"\bleftover::"), "records of unfinished jobs belong to lors::job"),
    (re.compile(r"\bby_depot\b"), "the per-depot runner belongs to the library"),
    (re.compile(r"lors_ibp::(?:\{[^}]*\bConnection\b|Connection\b|client\b)"),
     "raw IBP connections belong to the library (lors::Pool)"),
]

SAVE = re.compile(r"\bxnd::save\b")
# Saves that make no allocation, so that nothing is left to release or
# record when they fail: the exNode written is the user's own (a copy with
# capabilities stripped, a share's alias read capabilities, an object the
# caller saves by hand). By file: how many each may hold.
SAVE_SITES = {
    "crates/cli/src/commands/modify.rs": 1,
    "crates/cli/src/commands/share.rs": 1,
    "crates/py/src/exnode.rs": 1,
}


def code_lines(path):
    """(number, line) of the file's code outside comments and test modules."""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("#[cfg(test)]"):
            return
        stripped = line.strip()
        if stripped.startswith("//"):
            continue
        yield n, line


def main():
    bad = []
    for front in FRONTS:
        for path in sorted((ROOT / front).rglob("*.rs")):
            rel = str(path.relative_to(ROOT))
            saves = 0
            for n, line in code_lines(path):
                for rule, why in RULES:
                    if rule.search(line):
                        bad.append(f"{rel}:{n}: {why}: {line.strip()}")
                saves += len(SAVE.findall(line))
            allowed = SAVE_SITES.get(rel, 0)
            if saves > allowed:
                bad.append(f"{rel}: {saves} xnd::save calls, {allowed} allowed: save through lors::job")
    for line in bad:
        print(line)
    if bad:
        print(f"{len(bad)} layer rule(s) broken (see scripts/layers.py)")
        return 1
    print("layers: the front ends hold no job logic the rules name")
    return 0


if __name__ == "__main__":
    sys.exit(main())
