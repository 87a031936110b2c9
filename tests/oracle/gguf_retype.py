#!/usr/bin/env python3
# gguf_retype: rewrites a GGUF (an F32 one that tokenmill mkmodel wrote) with llama.cpp's own
# gguf-py, its matrices in weight types that no reference quantiser writes without an
# importance matrix (IQ2_XXS, IQ2_XS, IQ1_S) or that tokenmill does not quantise (the other
# i-quants): each chosen matrix becomes random blocks of the type, every index, sign and
# sub-block scale drawn uniformly, under one fp16 super-block scale chosen so that the
# matrix's standard deviation (as gguf-py dequantises it) is the original one. The model
# stays a random-weight model of the same statistics; llama.cpp and tokenmill then read the
# same bytes, which is what the oracle compares.
#
#   gguf_retype.py IN.gguf -o OUT.gguf [--type T] [--map NAME=T ...] [--seed N]
#
# --type: every matrix (a .weight of two or more dimensions, not a router ffn_gate_inp) in
# T; --map: the tensor NAME (without .weight) in T, before --type. Other tensors and every
# metadata key are copied as they are. Needs python3 with numpy (Debian: python3-numpy).
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402
from gguf_common import finish  # noqa: E402

Q = gguf.GGMLQuantizationType


def scale_bytes(qt, bsize):
    """Byte offsets of the fp16 super-block scale in a block (IQ1_M: scattered, None)."""
    if qt == Q.IQ1_M:
        return None
    if qt in (Q.TQ1_0, Q.TQ2_0):
        return bsize - 2
    return 0


def set_scale(blocks, qt, d):
    """blocks: (n, bsize) uint8; sets every block's super-block scale to the fp16 d."""
    h = int(np.array([d], dtype=np.float16).view(np.uint16)[0])
    off = scale_bytes(qt, blocks.shape[1])
    if off is None:  # IQ1_M: the top nibble of each of the four uint16 scale words (bytes 48..55)
        for k in range(4):
            b = 48 + 2 * k + 1
            blocks[:, b] = (blocks[:, b] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)
    else:
        blocks[:, off] = h & 0xFF
        blocks[:, off + 1] = h >> 8


def random_matrix(a, qt, rng):
    rows, cols = a.shape[:-1], a.shape[-1]
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    if qt in (Q.TQ1_0, Q.TQ2_0):  # ternary: gguf-py quantises them as ggml does
        return quantize(a, qt)
    n = int(np.prod(rows)) * (cols // bs)
    blocks = rng.integers(0, 256, size=(n, ts), dtype=np.uint8)
    set_scale(blocks, qt, 1.0)
    unit = float(np.std(dequantize(blocks.reshape(-1), qt)))
    set_scale(blocks, qt, float(np.std(a)) / unit)
    return blocks.reshape(*rows, (cols // bs) * ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--type", default=None)
    ap.add_argument("--map", action="append", default=[], metavar="NAME=TYPE")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    mapping = {}
    for m in a.map:
        k, v = m.split("=", 1)
        mapping[k] = Q[v.upper()]
    default = Q[a.type.upper()] if a.type else None
    rng = np.random.default_rng(a.seed)

    r = gguf.GGUFReader(a.input)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(a.out + ".tmp", arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), vt)
    used = set()
    for t in r.tensors:
        base = t.name[:-len(".weight")] if t.name.endswith(".weight") else None
        qt = mapping.get(base) if base else None
        if qt is not None:
            used.add(base)
        elif base and default is not None and len(t.shape) >= 2 and not base.endswith("ffn_gate_inp"):
            qt = default
        if qt is None or t.tensor_type != Q.F32:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type if t.tensor_type != Q.F32 else None)
            continue
        data = np.array(t.data, dtype=np.float32)
        if data.shape[-1] % gguf.GGML_QUANT_SIZES[qt][0]:
            sys.exit(f"gguf_retype: {t.name}: rows of {data.shape[-1]} are not whole {qt.name} blocks")
        w.add_tensor(t.name, random_matrix(data, qt, rng), raw_dtype=qt)
    missing = set(mapping) - used
    if missing:
        sys.exit(f"gguf_retype: no tensor {sorted(missing)}")
    finish(w, a.out)


if __name__ == "__main__":
    main()
