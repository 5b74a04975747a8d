#!/usr/bin/env python3
"""st_check.py - an independent check of zs-ckpt export with the reference `safetensors` package.

usage: st_check.py [--dtype fp32|bf16] OUT.safetensors|OUT.safetensors.index.json REF.f32

REF.f32 is the raw little-endian fp32 weights of every parameter, concatenated in manifest order. The
export must hold exactly those parameters in that order (across shard files for an index), fp32 values
bit for bit, bf16 values rounded to nearest even, and the metadata zs-ckpt writes. Every file is opened
with safetensors.safe_open, which validates the header its own way. Exits 0 ok, 1 mismatch, 77 when
safetensors or numpy is not installed (pip install safetensors numpy).
"""
import argparse
import json
import os
import struct
import sys

try:
    import numpy as np
    from safetensors import safe_open
except ImportError as e:
    print(f"st_check: skipped: {e} (pip install safetensors numpy)")
    sys.exit(77)


def header(path):
    """The header's tensors sorted by data offset, the metadata, and where the data start."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    meta = hdr.pop("__metadata__", {})
    return sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0]), meta, 8 + n


def files_of(path):
    """The safetensors files in order, checking the index when given one."""
    if not path.endswith(".index.json"):
        return [path], None
    with open(path) as f:
        index = json.load(f)
    names = sorted(set(index["weight_map"].values()))
    return [os.path.join(os.path.dirname(path), n) for n in names], index


def bf16_rne(x):
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def check_file(path, ref, at, dtype, fail):
    tensors, meta, start = header(path)
    if meta.get("format") != "pt" or meta.get("source") != "zeroshard" or "global_step" not in meta:
        fail(f"{path}: metadata {meta}")
    with safe_open(path, framework="numpy") as st:
        if sorted(st.keys()) != sorted(k for k, _ in tensors):
            fail(f"{path}: safe_open sees {sorted(st.keys())}")
        raw = np.fromfile(path, dtype=np.uint8)
        for name, info in tensors:
            n = int(np.prod(info["shape"], dtype=np.int64))
            want = ref[at:at + n]
            if want.size != n:
                fail(f"{path}: {name}: reference too short")
                return at
            if info["dtype"] != ("F32" if dtype == "fp32" else "BF16"):
                fail(f"{path}: {name}: dtype {info['dtype']}, expected {dtype}")
            elif dtype == "fp32":
                got = st.get_tensor(name)
                if list(got.shape) != info["shape"] or \
                        not np.array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32)):
                    fail(f"{path}: {name}: F32 values differ from the reference")
            else:
                b, e = info["data_offsets"]
                got = raw[start + b:start + e].view(np.uint16)
                if not np.array_equal(got, bf16_rne(want)):
                    fail(f"{path}: {name}: BF16 values are not the reference rounded to nearest even")
            at += n
    return at


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("out")
    ap.add_argument("ref")
    a = ap.parse_args()
    errors = []
    ref = np.fromfile(a.ref, dtype="<f4")
    files, index = files_of(a.out)
    at = 0
    for path in files:
        at = check_file(path, ref, at, a.dtype, errors.append)
    if at != ref.size:
        errors.append(f"{a.out}: holds {at} elements, the reference {ref.size}")
    if index is not None:
        size = 2 if a.dtype == "bf16" else 4
        if index["metadata"]["total_size"] != ref.size * size:
            errors.append(f"{a.out}: total_size {index['metadata']['total_size']} != {ref.size * size}")
        for path in files:
            for name, _ in header(path)[0]:
                if index["weight_map"].get(name) != os.path.basename(path):
                    errors.append(f"{a.out}: weight_map[{name}] is not {os.path.basename(path)}")
    for e in errors:
        print("st_check: FAIL " + e)
    print(f"st_check: {a.out}: {len(files)} file(s), {at} elements, {a.dtype}: {'FAIL' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
