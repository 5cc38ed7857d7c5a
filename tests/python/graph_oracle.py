#!/usr/bin/env python3
"""llama.cpp's own view of what it computes: a greedy decode through
llama-cpp-python's low-level API, optionally with an eval callback
(`cb_eval`) that records every node the scheduler computes.

    python graph_oracle.py MODEL --prompt "hello world" -n 8 --threads 2 [--oracle out.json]

Without --oracle the decode runs untouched (that run is the one ttrace
traces); with it, per `llama_decode` call (one ubatch here: the prompt fits
one) the JSON holds every node the scheduler computed, in order: name, op
name, shape, the GET_ROWS indices and the MoE routing (`ffn_moe_argsort-L`
rankings, which `ffn_moe_topk-L` views). Greedy sampling on the same build
and thread count makes both runs compute the same tokens. With --top2 the
printed JSON also holds, per generated token, the best and the runner-up
logit: how close the greedy choice was to a tie. With --values each node
also gets its output's fingerprint (blake3 of its elements' bytes in
row-major order, f64 sum and RMS), as `ttrace run --values` records it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys

import llama_cpp.llama_cpp as L
from pathlib import Path

# ggml_tensor offsets (x86_64, see the project notes, section 5).
TYPE, NE, NB, OP, SRC, DATA, NAME = 0, 16, 48, 80, 152, 248, 256
GGML_TYPE_I32 = 26

# ggml's op names, from the same libggml-base llama_cpp loaded.
_base = ctypes.CDLL(str(Path(L.__file__).parent / "lib" / "libggml-base.so.0"))
_base.ggml_op_name.restype = ctypes.c_char_p
_base.ggml_op_name.argtypes = [ctypes.c_int]
_base.ggml_op_name(0)
OP_NAMES = []
for _i in range(256):
    _name = _base.ggml_op_name(_i)
    if not _name or _name == b"COUNT":
        break
    OP_NAMES.append(_name.decode())
GET_ROWS = OP_NAMES.index("GET_ROWS")


def read(addr: int, ctype):
    return ctype.from_address(addr).value


def tensor_name(t: int) -> str:
    return ctypes.string_at(t + NAME, 64).split(b"\0", 1)[0].decode()


def shape(t: int) -> list[int]:
    return [read(t + NE + 8 * i, ctypes.c_int64) for i in range(4)]


def i32_data(t: int) -> list[int]:
    n = 1
    for d in shape(t):
        n *= d
    data = read(t + DATA, ctypes.c_void_p)
    return list((ctypes.c_int32 * n).from_address(data)) if data else []


# ggml types whose elements the fingerprint reads, as numpy dtypes (BF16
# is read as its 16 bits and widened by hand).
DTYPES = {0: "<f4", 1: "<f2", 26: "<i4", 30: "<u2"}


def fingerprint(t: int) -> dict | None:
    """blake3/sum/RMS of the node's elements, or None for a quantised type."""
    import blake3
    import numpy as np

    type_id = read(t + TYPE, ctypes.c_int32)
    if type_id not in DTYPES:
        return None
    ne = shape(t)
    nb = [read(t + NB + 8 * i, ctypes.c_uint64) for i in range(4)]
    data = read(t + DATA, ctypes.c_void_p)
    if not data or min(ne) <= 0:
        return None
    span = np.dtype(DTYPES[type_id]).itemsize + sum((n - 1) * s for n, s in zip(ne, nb))
    raw = np.frombuffer(ctypes.string_at(data, span), dtype=DTYPES[type_id])
    view = np.lib.stride_tricks.as_strided(raw, shape=ne[::-1], strides=nb[::-1])
    elements = np.ascontiguousarray(view)
    if type_id == 30:
        values = (elements.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        values = elements.astype(np.float64)
    return {
        "blake3": blake3.blake3(elements.tobytes()).hexdigest(),
        "sum": float(values.sum()),
        "rms": float(np.sqrt(np.mean(values * values))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--prompt", default="hello world")
    ap.add_argument("-n", type=int, default=8, help="tokens to generate")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--oracle", help="write the eval callback's nodes here (JSON)")
    ap.add_argument("--no-mmap", action="store_true", help="read the model into buffers instead of mapping it")
    ap.add_argument("--top2", action="store_true", help="print each step's two highest logits")
    ap.add_argument("--values", action="store_true", help="with --oracle: each node's output fingerprint")
    args = ap.parse_args()

    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    mparams.use_mmap = not args.no_mmap
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        sys.exit(f"graph_oracle: llama.cpp could not load {args.model}")
    vocab = L.llama_model_get_vocab(model)

    graphs: list[list[dict]] = []
    current: list[dict] = []

    @L.ggml_backend_sched_eval_callback
    def on_node(t, ask, _user):
        if ask:
            return True  # see every node, after it is computed
        t = ctypes.cast(t, ctypes.c_void_p).value
        op = read(t + OP, ctypes.c_int32)
        node = {"name": tensor_name(t), "op": OP_NAMES[op] if op < len(OP_NAMES) else str(op), "shape": shape(t)}
        name = node["name"]
        if name.startswith("ffn_moe_argsort") or name.startswith("ffn_moe_topk"):
            node["ids"] = i32_data(t) if name.startswith("ffn_moe_argsort") else None
        src1 = read(t + SRC + 8, ctypes.c_void_p)
        if src1 and read(src1 + TYPE, ctypes.c_int32) == GGML_TYPE_I32 and op == GET_ROWS:
            node["rows"] = i32_data(src1)
            node["src0"] = tensor_name(read(t + SRC, ctypes.c_void_p))
        if args.values and node["op"] not in ("NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
            node["fingerprint"] = fingerprint(t)
        current.append(node)
        return True

    cparams = L.llama_context_default_params()
    cparams.n_ctx = args.ctx
    cparams.n_threads = cparams.n_threads_batch = args.threads
    if args.oracle:
        cparams.cb_eval = on_node
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        sys.exit("graph_oracle: llama.cpp could not create a context")

    text = args.prompt.encode()
    tokens = (L.llama_token * (len(text) + 8))()
    n = L.llama_tokenize(vocab, text, len(text), tokens, len(tokens), True, True)
    if n < 0:
        sys.exit("graph_oracle: tokenizing failed")
    batch_tokens = list(tokens[:n])
    generated: list[int] = []
    top2: list[list[float]] = []
    n_vocab = L.llama_vocab_n_tokens(vocab)
    for step in range(args.n + 1):
        arr = (L.llama_token * len(batch_tokens))(*batch_tokens)
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(batch_tokens))) != 0:
            sys.exit(f"graph_oracle: llama_decode failed at step {step}")
        graphs.append(current)
        current = []
        if step == args.n:
            break
        logits = L.llama_get_logits_ith(ctx, -1)
        best = max(range(n_vocab), key=lambda i: logits[i])
        generated.append(best)
        if args.top2:
            second = max((i for i in range(n_vocab) if i != best), key=lambda i: logits[i])
            top2.append([logits[best], logits[second]])
        batch_tokens = [best]

    if args.oracle:
        with open(args.oracle, "w") as f:
            json.dump({"prompt_tokens": list(tokens[:n]), "generated": generated, "ubatches": graphs}, f)
    printed = {"prompt_tokens": list(tokens[:n]), "generated": generated}
    print(json.dumps({**printed, "top2": top2} if args.top2 else printed))
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
