#!/usr/bin/env python3
"""code_map.py - the library's shape in four numbers, for reviews of its structure.

    python3 tools/code_map.py [BUILD_DIR]      (default: build)

Prints the largest folder's share of the library's lines, the longest function, the largest circle of
files that call each other (from the object files' symbols: file A depends on file B when A calls or reads
something B defines), the folders that call each other both ways, and the header included by the most
library files. Reads the sources and `nm` of BUILD_DIR's library objects; changes nothing.
"""
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_LIBRARY = {"examples", "tests", "bench", "tools", "python", "docs", "cmake", "build"}


def library_files():
    out = subprocess.run(["git", "ls-files", "*.c", "*.h", "*.cu"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [f for f in out if "/" in f and f.split("/")[0] not in NOT_LIBRARY]


def folder_shares(files):
    lines = collections.Counter()
    for f in files:
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            lines[f.split("/")[0]] += sum(1 for _ in fh)
    total = sum(lines.values())
    return lines, total


FUNC_START = re.compile(r"^(?!static inline)[A-Za-z_][^;=]*\b([A-Za-z_]\w*)\s*\([^;]*$")


def longest_functions(files, n=5):
    """Top-level definitions: a line at column 0 naming NAME( ... then a '{' at column 0, to the '}' there."""
    found = []
    for f in files:
        if not f.endswith((".c", ".cu")):
            continue
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            text = fh.read().split("\n")
        name, start = None, None
        for i, line in enumerate(text):
            m = FUNC_START.match(line)
            if m and start is None:
                name, head = m.group(1), i
            if line.startswith("{") and name is not None and start is None:
                start = head
            elif line.startswith("}") and start is not None:
                found.append((i - start + 1, f"{f}:{start + 1}", name))
                name, start = None, None
    return sorted(found, reverse=True)[:n]


def object_symbols(build):
    objdir = os.path.join(build, "CMakeFiles", "zs_objects.dir")
    defs, uses = {}, collections.defaultdict(set)
    for dirpath, _, names in os.walk(objdir):
        for nm_ in names:
            if not nm_.endswith(".o"):
                continue
            obj = os.path.join(dirpath, nm_)
            src = os.path.relpath(obj, objdir)[: -len(".o")]
            out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == "U":
                    uses[src].add(parts[1])
                elif len(parts) == 3 and parts[1] in "TDBRV":
                    defs[parts[2]] = src
    graph = {s: {defs[u] for u in us if u in defs and defs[u] != s} for s, us in uses.items()}
    for s in defs.values():
        graph.setdefault(s, set())
    return graph


def strongly_connected(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):  # Tarjan's algorithm, iterative enough for a few hundred files
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return sorted(out, key=len, reverse=True)


def most_included(files):
    count = collections.Counter()
    for f in files:
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            for line in fh:
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if m:
                    count[os.path.basename(m.group(1))] += 1
    return count.most_common(3)


def main():
    build = os.path.join(ROOT, sys.argv[1] if len(sys.argv) > 1 else "build")
    files = library_files()
    lines, total = folder_shares(files)
    big, n = lines.most_common(1)[0]
    print(f"library lines: {total}; largest folder: {big}/ {n} ({100.0 * n / total:.1f}%); "
          + ", ".join(f"{k}/ {v}" for k, v in lines.most_common()))
    print("longest library functions: " + "; ".join(f"{name} {ln} lines ({where})"
                                                    for ln, where, name in longest_functions(files)))
    everything = subprocess.run(["git", "ls-files", "*.c", "*.cu"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()
    print("longest functions anywhere: " + "; ".join(f"{name} {ln} lines ({where})"
                                                     for ln, where, name in longest_functions(everything, 3)))
    graph = object_symbols(build)
    comps = [c for c in strongly_connected(graph) if len(c) > 1]
    if comps:
        print(f"largest call circle: {len(comps[0])} files: {' '.join(comps[0])}")
    else:
        print("largest call circle: 0 files (no two library files call each other, directly or round a loop)")
    folder = lambda s: s.split("/")[0]
    calls = {(folder(a), folder(b)) for a in graph for b in graph[a] if folder(a) != folder(b)}
    both = sorted({tuple(sorted(e)) for e in calls if (e[1], e[0]) in calls})
    fgraph = collections.defaultdict(set)
    for a, b in calls:
        fgraph[a].add(b)
        fgraph.setdefault(b, set())
    fcomps = [c for c in strongly_connected(fgraph) if len(c) > 1]
    print("largest circle of folders: " + (f"{len(fcomps[0])} folders: {' '.join(fcomps[0])}" if fcomps
                                            else "none (the folders' calls run one way)"))
    print("folders calling each other both ways: " + (", ".join(f"{a}<->{b}" for a, b in both) or "none"))
    print("most included headers: " + ", ".join(f"{h} by {c} library files" for h, c in most_included(files)))


if __name__ == "__main__":
    main()
