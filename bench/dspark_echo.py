#!/usr/bin/env python3
# dspark_echo: a DSpark drafter whose drafts are known to pass some of the time, for measurements
# and tests that need accepted drafts (bench/spec's dspark-echo rows, bench/dspark_calib,
# tests/e2e/spec_dflash.test.mjs's distribution test). A random drafter's tokens are never the
# target's; this one drafts "the anchor again" at every slot, which a target caught in a loop of
# period 1 (what random-weight models' greedy outputs often fall into) accepts.
#
#   dspark_echo.py --target TARGET.gguf [--block 6] [--scale 1000] [--seed 1] -o OUT.gguf
#
# How: tests/oracle/gguf_dflash.py writes a random DSpark drafter (2 layers, confidence head)
# with a Markov head of rank R, the least with C(R, R/2) >= the vocabulary (20 for 152k
# tokens, as cheap as the random drafters' rank 16); the Markov matrices are then rewritten in
# place: w1[t] is the t-th subset of R/2 of the R dimensions (0/1), w2 = scale x w1. The Markov
# bias w2 . w1[prev] is then R/2 x scale for prev itself and at most (R/2 - 1) x scale for any
# other token (two distinct subsets of one size share fewer elements), exact in F32, so with a
# scale far above the backbone's logits (a few units) every slot's argmax is the previous
# slot's, i.e. the anchor. The backbone and the confidence head keep gguf_dflash.py's random
# weights: the confidences say nothing about acceptance (what a calibration table shows for an
# untrained head).
import argparse
import itertools
import math
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "tests", "oracle")
sys.path.insert(0, os.path.join(HERE, "..", "tests", "data", "llama.cpp", "gguf-py"))
import gguf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--block", type=int, default=6)
    ap.add_argument("--scale", type=float, default=1000.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()

    r = gguf.GGUFReader(a.target)
    n_vocab = len(r.fields["tokenizer.ggml.tokens"].contents())   # the drafter's Markov rows (gguf_dflash.py)
    R = 2
    while math.comb(R, R // 2) < n_vocab:
        R += 1
    subprocess.run([sys.executable, os.path.join(ORACLE, "gguf_dflash.py"), "--target", a.target,
                    "--block", str(a.block), "--markov", str(R), "--conf", "--seed", str(a.seed),
                    "-o", a.output], check=True)

    d = gguf.GGUFReader(a.output, "r+")
    t = {x.name: x for x in d.tensors}
    w1, w2 = t["markov_w1.weight"].data, t["markov_w2.weight"].data   # (n_vocab, R) float32, mapped
    if w1.shape != (n_vocab, R) or w1.dtype != np.float32 or w2.shape != w1.shape or w2.dtype != np.float32:
        sys.exit(f"dspark_echo: unexpected Markov head {w1.shape} {w1.dtype} ({n_vocab}, {R}) float32 wanted")
    code = np.zeros((n_vocab, R), dtype=np.float32)
    for i, sub in zip(range(n_vocab), itertools.combinations(range(R), R // 2)):
        code[i, list(sub)] = 1
    w1[:] = code
    w2[:] = code * np.float32(a.scale)
    d.data.flush()


if __name__ == "__main__":
    main()
