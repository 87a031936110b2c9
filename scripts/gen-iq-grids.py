#!/usr/bin/env python3
# gen-iq-grids: writes src/model/quant_grids.c, the i-quants' codebooks (the 8- and 4-element
# grid points of IQ2_*, IQ3_*, IQ1_* and the sign table), from the bundled ggml's
# ggml-common.h (scripts/fetch-testdata.sh fetches it). test_quant compares the written
# tables with that header entry by entry.
#   scripts/gen-iq-grids.py [ggml-common.h] > src/model/quant_grids.c
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "tests/data/llama.cpp/ggml/src/ggml-common.h"
text = open(src).read()
TABLES = [  # (ggml name, our name, C type, per line, hex digits)
    ("ksigns_iq2xs", "quant_grids_ksigns", "uint8_t", 16, 0),
    ("iq2xxs_grid", "quant_grids_iq2xxs", "uint64_t", 4, 16),
    ("iq2xs_grid", "quant_grids_iq2xs", "uint64_t", 4, 16),
    ("iq2s_grid", "quant_grids_iq2s", "uint64_t", 4, 16),
    ("iq3xxs_grid", "quant_grids_iq3xxs", "uint32_t", 8, 8),
    ("iq3s_grid", "quant_grids_iq3s", "uint32_t", 8, 8),
    ("iq1s_grid", "quant_grids_iq1s", "uint64_t", 4, 16),
]
out = ["""/*
 * quant_grids: the i-quants' codebooks, ggml's tables (ggml-common.h) as data. Written by
 * scripts/gen-iq-grids.py from the bundled ggml; test_quant checks every entry against it.
 *
 * A grid entry packs its points one per byte, little-endian (byte j is element j): the
 * IQ2 grids' points are 8, 25 or 43 (the value is point * scale / 8), the IQ3 ones' 4..62
 * (4 points), the IQ1 ones' -1, 0, 1 as int8. quant_grids_ksigns maps 7 sign bits to 8 (the
 * eighth makes the count of minus signs even).
 */
#include "model/quant_grids.h"
"""]
for gname, name, ctype, per, hexd in TABLES:
    m = re.search(r"GGML_TABLE_BEGIN\(\s*\w+\s*,\s*%s\s*,\s*(\w+)\s*\)(.*?)GGML_TABLE_END" % gname, text, re.S)
    if not m:
        sys.exit(f"gen-iq-grids: {gname} not found in {src}")
    vals = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", m.group(2))]
    out.append(f"\nconst {ctype} {name}[{len(vals)}] = {{")
    for i in range(0, len(vals), per):
        row = vals[i:i + per]
        if hexd:
            out.append("    " + " ".join(f"0x{v:0{hexd}x}," for v in row))
        else:
            out.append("    " + " ".join(f"{v:3d}," for v in row))
    out.append("};")
print("\n".join(out))
