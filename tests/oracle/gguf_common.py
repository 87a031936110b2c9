# gguf_common: what the gguf-py model writers in this folder (gguf_arch, gguf_bert, gguf_dflash,
# gguf_dsv4, gguf_moe, gguf_qwen35, gguf_retype) share: copying a vocabulary's tokenizer.* keys
# writing a float32 array as a tensor of a given type, and writing the file out. Imported from the same folder, after the script has put llama.cpp's
# gguf-py (tests/data/llama.cpp/gguf-py) on sys.path.
import os

import numpy as np

import gguf
from gguf.quants import quantize


def copy_vocab(w, src, skip=()):
    """Copies every tokenizer.* key but those in skip from src (a GGUFReader or a path) into w;
    returns the number of tokens."""
    r = src if isinstance(src, gguf.GGUFReader) else gguf.GGUFReader(src)
    n = 0
    for name, f in r.fields.items():
        if not name.startswith("tokenizer.") or name in skip:
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            vals = f.contents()
            w.add_key_value(name, vals, vt, sub_type=f.types[-1])
            if name == "tokenizer.ggml.tokens":
                n = len(vals)
        else:
            w.add_key_value(name, f.contents(), vt)
    return n


def put(w, name, x, t):
    """Adds the float32 array x to w as tensor name of type t (F32, F16 or a quantised type)."""
    if t == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, x)
    elif t == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, x.astype(np.float16))
    else:
        w.add_tensor(name, quantize(x, t), raw_dtype=t)


def finish(w, out):
    """Writes w (opened on out + ".tmp") and renames it to out."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(out + ".tmp", out)
