#!/usr/bin/env python3
"""Hold the workspace to its size rules (CI runs this from scripts/test.sh).

- No file of a CLI command (crates/cli/src/commands/*.rs) over 300 lines.
- No function in crates/ over 120 lines, outside tests.

A function's length runs from its `fn` line to its closing brace. Test code
is skipped: files under tests/ or benches/, files named tests.rs, and
everything after a top-level `#[cfg(test)]` (our test modules close their files).

Usage: scripts/sizes.py [--top N]   (--top lists the N longest functions)
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMAND_FILE_LINES = 300
FUNCTION_LINES = 120

FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
                r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def strip_code(line):
    """The line with string/char literals and comments blanked, so braces
    inside them do not count."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        c = line[i]
        if c == "/" and i + 1 < n and line[i + 1] == "/":
            break
        if c == '"':
            i += 1
            while i < n and line[i] != '"':
                i += 2 if line[i] == "\\" else 1
            i += 1
            continue
        if c == "'" and i + 2 < n and (line[i + 2] == "'" or line[i + 1] == "\\"):
            j = line.find("'", i + 2)
            i = j + 1 if j > 0 else n
            continue
        out.append(c)
        i += 1
    return "".join(out)


def is_test_file(path):
    parts = path.relative_to(ROOT).parts
    return "tests" in parts or "benches" in parts or path.name == "tests.rs"


def functions(path):
    """(name, first line, length) of each function outside test code."""
    lines = path.read_text().splitlines()
    found = []
    stack = []  # (name, start line, depth at which its body opened)
    depth = 0
    pending = None  # a `fn` seen whose body brace has not come yet
    nesting = 0  # open ( and [, so the `;` of `[u8; 4]` ends no declaration
    in_raw = False
    for number, raw in enumerate(lines, 1):
        if raw.startswith("#[cfg(test)]"):
            break
        if in_raw:
            if '"#' in raw:
                in_raw = False
            continue
        if 'r#"' in raw and '"#' not in raw.split('r#"', 1)[1]:
            in_raw = True
            raw = raw.split('r#"', 1)[0]
        m = FN.match(raw)
        if m:
            pending = (m.group(1), number)
        code = strip_code(raw)
        for c in code:
            if c == "{":
                depth += 1
                if pending:
                    stack.append((pending[0], pending[1], depth))
                    pending = None
            elif c == "}":
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    found.append((name, start, number - start + 1))
                depth -= 1
            elif c in "([":
                nesting += 1
            elif c in ")]":
                nesting -= 1
            elif c == ";" and pending and nesting == 0:
                pending = None  # a declaration without a body (trait item)
    return found


def main():
    top = 0
    if len(sys.argv) > 2 and sys.argv[1] == "--top":
        top = int(sys.argv[2])
    problems = []
    every = []
    for path in sorted((ROOT / "crates").rglob("*.rs")):
        if is_test_file(path):
            continue
        rel = path.relative_to(ROOT)
        if rel.parts[:4] == ("crates", "cli", "src", "commands"):
            count = len(path.read_text().splitlines())
            if count > COMMAND_FILE_LINES:
                problems.append(f"{rel}: {count} lines (a command file holds at most {COMMAND_FILE_LINES})")
        for name, start, length in functions(path):
            every.append((length, f"{rel}:{start} {name}"))
            if length > FUNCTION_LINES:
                problems.append(f"{rel}:{start}: fn {name} is {length} lines (at most {FUNCTION_LINES})")
    for length, where in sorted(every, reverse=True)[:top]:
        print(f"{length:5} {where}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(f"{len(problems)} size rule(s) broken: split the file or function by job", file=sys.stderr)
        return 1
    print(f"sizes: {len(every)} functions within {FUNCTION_LINES} lines, command files within {COMMAND_FILE_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
