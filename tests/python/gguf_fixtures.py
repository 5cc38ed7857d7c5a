"""GGUF fixtures written with the PyPI `gguf` package, the reference writer.

Used by test_gguf_oracle.py; `python gguf_fixtures.py OUT.gguf` writes the
small model committed as tracer-user/tests/fixtures/tiny-moe.gguf.
"""
from __future__ import annotations

import sys
from math import ceil
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
V = gguf.GGUFValueType

NATIVE = {Q.F32: np.float32, Q.F16: np.float16, Q.F64: np.float64, Q.I8: np.int8,
          Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64}


def add_tensor(w: gguf.GGUFWriter, name: str, qtype: Q, ne: list[int], rng: np.random.Generator) -> None:
    """Adds a tensor of ggml shape `ne` (ne0 first) with random contents."""
    np_shape = tuple(reversed(ne))
    if qtype in NATIVE:
        data = rng.integers(-100, 100, size=np_shape).astype(NATIVE[qtype])
        w.add_tensor(name, data)
        return
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert ne[0] % block == 0, (name, qtype, ne)
    byte_shape = np_shape[:-1] + (ne[0] // block * size,)
    w.add_tensor(name, rng.integers(0, 256, size=byte_shape, dtype=np.uint8), raw_dtype=qtype)


def write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def all_types(path: Path, alignment: int | None = None, endian=gguf.GGUFEndian.LITTLE) -> Path:
    """Every ggml type the gguf package knows, every KV type, nested arrays."""
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    if alignment:
        w.add_custom_alignment(alignment)
    scalars = [(V.UINT8, 200), (V.INT8, -5), (V.UINT16, 60000), (V.INT16, -300), (V.UINT32, 4_000_000_000),
               (V.INT32, -70000), (V.FLOAT32, 0.1), (V.BOOL, True), (V.STRING, "héllo wörld"),
               (V.UINT64, 2**63 + 5), (V.INT64, -(2**40)), (V.FLOAT64, 1e-300)]
    for vtype, value in scalars:
        w.add_key_value(f"test.scalar.{vtype.name.lower()}", value, vtype)
    for vtype, value in scalars:
        w.add_key_value(f"test.array.{vtype.name.lower()}", [value] * 3, V.ARRAY, sub_type=vtype)
    w.add_key_value("test.array.long", list(range(1000)), V.ARRAY, sub_type=V.INT32)
    w.add_key_value("test.array.nested", [[1, 2], [3, 4, 5]], V.ARRAY)
    w.add_key_value("test.array.nested_str", [["a", "b"], ["c"]], V.ARRAY)
    w.add_key_value("test.array.bytes", b"\x00\x01\xff", V.ARRAY)
    w.add_key_value("test.string.empty", "", V.STRING)
    for i, (qtype, (block, _)) in enumerate(gguf.GGML_QUANT_SIZES.items()):
        ne = [[block * 2], [block * 2, 3], [block, 2, 3], [block, 1, 2, 2]][i % 4]
        add_tensor(w, f"blk.{i}.t_{qtype.name.lower()}.weight", qtype, ne, rng)
    write(w)
    return path


def llama_like(path: Path, n_layer: int = 2, n_embd: int = 64, n_ff: int = 128, n_vocab: int = 300,
               qtype: Q = Q.F16, n_expert: int = 0, split_into: int = 0) -> Path:
    """Names and metadata as llama.cpp expects; MoE when n_expert > 0; split into N shards."""
    rng = np.random.default_rng(2)
    tensors: list[tuple[str, Q, list[int]]] = [("token_embd.weight", qtype, [n_embd, n_vocab])]
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", Q.F32, [n_embd]), (b + "attn_q.weight", qtype, [n_embd, n_embd]),
                    (b + "attn_k.weight", qtype, [n_embd, n_embd]), (b + "attn_v.weight", qtype, [n_embd, n_embd]),
                    (b + "attn_output.weight", qtype, [n_embd, n_embd]), (b + "ffn_norm.weight", Q.F32, [n_embd])]
        if n_expert:
            tensors += [(b + "ffn_gate_inp.weight", Q.F32, [n_embd, n_expert]),
                        (b + "ffn_gate_exps.weight", qtype, [n_embd, n_ff, n_expert]),
                        (b + "ffn_up_exps.weight", qtype, [n_embd, n_ff, n_expert]),
                        (b + "ffn_down_exps.weight", qtype, [n_ff, n_embd, n_expert])]
        else:
            tensors += [(b + "ffn_gate.weight", qtype, [n_embd, n_ff]), (b + "ffn_up.weight", qtype, [n_embd, n_ff]),
                        (b + "ffn_down.weight", qtype, [n_ff, n_embd])]
    tensors += [("output_norm.weight", Q.F32, [n_embd]), ("output.weight", qtype, [n_embd, n_vocab])]
    split = ceil(len(tensors) / split_into) if split_into else 0
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split)
    w.add_name("ttrace fixture")
    w.add_block_count(n_layer)
    w.add_context_length(128)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"w{i}" for i in range(n_vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens[:n_vocab])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([1] * n_vocab)
    for name, q, ne in tensors:
        add_tensor(w, name, q, ne, rng)
    write(w)
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1])
    llama_like(out, n_layer=2, n_embd=32, n_ff=32, n_vocab=8, qtype=Q.Q4_0, n_expert=2)
    print(out, out.stat().st_size)
