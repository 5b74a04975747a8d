#!/usr/bin/env python3
"""check_layers.py [ROOT | --self-test] - fails when a library file includes a header from a folder above its own.

The order is tools/layers.txt's. Quoted includes are resolved from the repository root ("comm/comm.h"); a
bare name ("x.h") must be a header of the including file's own folder, or the public header under include/.
Prints one line per offence (file:line: what) and exits 1 if there is any, 0 otherwise. --self-test runs the
check on a scratch tree with one planted offence of each kind and fails unless it names exactly those."""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = ('.c', '.h', '.cu', '.cuh')


def read_layers(root):
    layers = []
    with open(os.path.join(root, 'tools', 'layers.txt')) as f:
        for line in f:
            name = line.split('#', 1)[0].strip()
            if name:
                layers.append(name)
    return {name: i for i, name in enumerate(layers)}


def folder_of(relpath):
    return relpath.split('/', 1)[0]


def check_include(root, rank, rel, name):
    """The offence of `rel` including "name", or None."""
    own = folder_of(rel)
    if '/' not in name:
        if os.path.exists(os.path.join(root, os.path.dirname(rel), name)):
            return None
        if os.path.exists(os.path.join(root, 'include', name)):
            return None
        return f'includes {name}, which is not in its own folder ({own}): name the folder ("folder/{name}")'
    target = folder_of(name)
    if target not in rank:
        return f'includes {name}, which is in no library folder (tools/layers.txt)'
    if not os.path.exists(os.path.join(root, name)):
        return f'includes {name}, which does not exist (paths start at the repository root)'
    if rank[target] > rank[own]:
        return f'includes {name} from a higher layer ({target})'
    return None


def check_tree(root):
    """Every offence under root's library folders, as 'file:line: what' lines, and how many files were read."""
    rank = read_layers(root)
    out = []
    files = 0
    for folder in rank:
        for dirpath, _, names in sorted(os.walk(os.path.join(root, folder))):
            for n in sorted(names):
                if not n.endswith(SOURCES):
                    continue
                files += 1
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, root)
                with open(path, errors='replace') as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        why = m and check_include(root, rank, rel, m.group(1))
                        if why:
                            out.append(f'{rel}:{lineno}: {why}')
    return out, files


def self_test():
    """A tree with one include of each kind, right and wrong: the check must name the wrong ones only."""
    tree = {
        'tools/layers.txt': 'include\nbase  # comment\ncomm\nruntime\n',
        'include/zeroshard.h': '',
        'base/error.h': '',
        'comm/comm.h': '#include "zeroshard.h"\n#include "base/error.h"\n',
        'comm/comm.c': '#include "comm.h"\n#include "runtime/engine.h"\n#include "error.h"\n',
        'runtime/engine.h': '#include "comm/comm.h"\n#include "comm/gone.h"\n',
    }
    want = ['comm/comm.c:2: includes runtime/engine.h from a higher layer (runtime)',
            'comm/comm.c:3: includes error.h, which is not in its own folder (comm): name the folder ("folder/error.h")',
            'runtime/engine.h:2: includes comm/gone.h, which does not exist (paths start at the repository root)']
    with tempfile.TemporaryDirectory() as root:
        for rel, text in tree.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), 'w') as f:
                f.write(text)
        got, _ = check_tree(root)
    if got != want:
        print('check_layers self-test: expected\n  ' + '\n  '.join(want) + '\ngot\n  ' + '\n  '.join(got))
        return 1
    print('check_layers self-test: the planted offences are named, nothing else')
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == '--self-test':
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..'))
    bad, files = check_tree(root)
    for line in bad:
        print(line)
    print(f'check_layers: {files} files, {len(bad)} backwards or unresolved includes')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
