#!/usr/bin/env python3
"""Fails when a function outside tests/ is longer than 80 lines, unless the
comment just above it says why it must be one piece ("one piece: ...").

Functions are found the way this code base is formatted (clang-format,
Google style): a definition starts at column 0 and its body closes with a
"}" at column 0. Lambdas and local classes count towards their function."""
import pathlib
import re
import sys

LIMIT = 80
FOLDERS = ["base", "codec", "store", "cache", "fuse", "gpu", "mount-tools", "bench"]


def functions(lines):
    i = 0
    while i < len(lines):
        line = lines[i]
        head = i
        if line.rstrip().endswith("{") and not line.startswith((" ", "\t", "}", "#", "/")) \
                and not re.match(r"^(namespace|struct|class|enum|union|extern|template\s*<[^>]*>\s*(struct|class))\b", line) \
                and ("(" in line or ")" in line):
            while head > 0 and "(" not in lines[head] and lines[head - 1].strip():
                head -= 1
            end = i + 1
            while end < len(lines) and not lines[end].startswith("}"):
                end += 1
            yield head, end
            i = end + 1
            continue
        i += 1


def exempt(lines, head):
    j = head - 1
    while j >= 0 and lines[j].lstrip().startswith("//"):
        if "one piece" in lines[j]:
            return True
        j -= 1
    return False


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    bad = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cc", ".cu"):
                continue
            lines = path.read_text(errors="replace").splitlines()
            for head, end in functions(lines):
                n = end - head + 1
                if n > LIMIT and not exempt(lines, head):
                    name = lines[head].strip()[:70]
                    bad.append(f"{path.relative_to(root)}:{head + 1}: {n} lines: {name}")
    for b in bad:
        print(f"check-function-length: {b} (over {LIMIT}; split it, or say why it is one piece)", file=sys.stderr)
    if bad:
        return 1
    print(f"check-function-length: ok (no function over {LIMIT} lines outside tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
