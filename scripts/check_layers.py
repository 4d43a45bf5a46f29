#!/usr/bin/env python3
"""Checks that every #include of a gradguard header follows the layer table of
docs/design.md: a file may include headers of its own layer or of the layers above it in
the table, never of a layer below. The table is read from design.md itself (the rows
`| N. name | `folder/` ... | ...`), so the document and the check cannot disagree.

Files checked: src/<folder>/..., include/gradguard/<folder>/... (by the folder right under
src/ or include/gradguard/), tools/, python/ and examples/ (the front ends). Private
headers included with quotes and no gradguard/ prefix are resolved next to the including
file. Exit 0 when every include follows the table; 1 with one line per violation
(file:line: what it includes, both layers); 2 when the table cannot be read.

Usage: scripts/check_layers.py [REPO_ROOT]
"""
import os
import re
import sys

ROW = re.compile(r"^\|\s*(\d+[a-z]?)\.\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|")
FOLDER = re.compile(r"`([^`]+?)/?`")
INCLUDE = re.compile(r'^\s*#\s*include\s+[<"](gradguard/[^">]+|[^">/]+\.h)[">]')


def layer_rank(label):
    """'4a' -> (4, 'a'): the order of the table's labels."""
    m = re.match(r"(\d+)([a-z]?)", label)
    return (int(m.group(1)), m.group(2))


def read_table(design):
    """folder -> (rank, label) from the Layers table; front ends keyed by their path."""
    folders = {}
    in_layers = False
    with open(design, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                in_layers = line.strip() == "## Layers"
                continue
            if not in_layers:
                continue
            m = ROW.match(line)
            if not m:
                continue
            label = m.group(1)
            for group in FOLDER.findall(m.group(3)):
                for folder in group.split():
                    folders[folder.rstrip("/")] = (layer_rank(label), label + ". " + m.group(2))
    return folders


def folder_of(path, folders):
    """The table's folder a repository path belongs to, or None (tests, bench, ...)."""
    parts = path.split(os.sep)
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[:2] == ["include", "gradguard"] and len(parts) > 3:
        return parts[2]
    for front in ("tools/gradguard", "python", "examples"):
        if path.startswith(front + os.sep) and front in folders:
            return front
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    os.chdir(root)
    folders = read_table("docs/design.md")
    if "core" not in folders or "train" not in folders:
        print("check_layers: docs/design.md has no readable Layers table", file=sys.stderr)
        return 2
    violations, checked = [], 0
    for top in ("src", "include/gradguard", "tools/gradguard", "python", "examples"):
        for dirpath, _, names in os.walk(top):
            for name in sorted(names):
                if not name.endswith((".h", ".cpp")):
                    continue
                path = os.path.join(dirpath, name)
                mine = folder_of(path, folders)
                if mine is None or mine not in folders:
                    continue
                rank, label = folders[mine]
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if target.startswith("gradguard/"):
                            theirs = target.split("/")[1]
                        else:  # a private header beside the file: same folder
                            continue
                        checked += 1
                        if theirs not in folders:
                            continue  # a header at include/gradguard/ itself, or not in the table
                        their_rank, their_label = folders[theirs]
                        if their_rank > rank:
                            violations.append(f"{path}:{number}: includes {target} ({their_label}) from {label}")
    for v in violations:
        print(v)
    sys.stdout.flush()
    print(f"check_layers: {checked} includes checked, {len(violations)} against the layer table of docs/design.md",
          file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
