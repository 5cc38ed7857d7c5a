#!/usr/bin/env python3
"""Generate the GGUF models ttrace's tests, benchmarks and demo trace.

Nothing can be downloaded on the build machines, so the models are synthetic:
llama architecture, an SPM ("llama") vocabulary with <unk>, <s>, </s>, the 256
byte tokens and a few words, random small-magnitude weights. llama.cpp loads
them and runs real compute on them. They are written with the PyPI `gguf`
package's GGUFWriter (the reference writer), so they also keep ttrace's own
GGUF reader honest.

    python scripts/gen_models.py --out DIR [--only NAME ...] [--force]

prints ONLY a JSON manifest {name: absolute path} on stdout (for a split
model, the first shard); progress goes to stderr.

Determinism and caching: every model has a fixed seed and each tensor draws
from its own generator seeded by (model seed, tensor index), so the same
parameters give byte-identical files. Next to each model, NAME.params.json
holds the parameters (spec, generator version, gguf and numpy versions) and
the size of every file written; a model is regenerated only when that record
differs or a file is missing or has another size. Files are written into
DIR/.tmp-NAME and renamed into place; the record is written last, so an
interrupted run never leaves a model that looks complete.

Tests import this file (SPECS, tensor_plan, expected_kv, tensor_data,
shard_paths, vocab) to compare what a reader sees against what was intended.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

# Bump when the output for unchanged specs changes (layout, vocab, weights).
GENERATOR_VERSION = 1

BOS_ID, EOS_ID, UNK_ID = 1, 2, 0
WORDS = ("hello", "world", "the", "llama", "trace", "token", "model")
SPM_SPACE = "\u2581"  # "▁", SentencePiece's word-boundary marker


@dataclass(frozen=True)
class ModelSpec:
    """Everything that decides a model's bytes (plus its file name)."""

    name: str
    seed: int
    n_layer: int
    n_embd: int
    n_ff: int  # per expert for MoE models
    n_head: int
    n_head_kv: int
    n_vocab: int
    n_ctx: int
    wtype: str  # type of the matrices: "F16", "Q8_0" or "Q4_0"; norms stay F32
    n_expert: int = 0
    n_expert_used: int = 0
    n_split: int = 1  # >1: written as that many shards NAME-0000i-of-0000N.gguf
    # True: write random quant blocks directly (fast, for big models); False:
    # draw F32 weights and convert them with gguf.quants (same values as the
    # F16 model with the same seed and shapes).
    direct_blocks: bool = False
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    # llama.cpp architecture: "llama", or "qwen3moe" (per-head q/k norms, its
    # own MoE graph code: a second routing path).
    arch: str = "llama"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def params(self) -> dict:
        spec = dataclasses.asdict(self)
        if self.arch == "llama":
            del spec["arch"]  # as before the field existed: cached llama models stay valid
        return {
            "spec": spec,
            "generator_version": GENERATOR_VERSION,
            "gguf": gguf_version(),
            "numpy": np.__version__,
        }


# The one place the models are defined. The tiny family shares seed and
# shapes, so tiny-q8/tiny-q4 hold tiny's weights quantized and tiny-split
# holds exactly tiny's tensors.
_TINY = dict(seed=1, n_layer=4, n_embd=256, n_ff=1280, n_head=4, n_head_kv=2, n_vocab=384, n_ctx=2048)
SPECS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec(name="tiny", wtype="F16", **_TINY),
        ModelSpec(name="tiny-q8", wtype="Q8_0", **_TINY),
        ModelSpec(name="tiny-q4", wtype="Q4_0", **_TINY),
        ModelSpec(name="tiny-split", wtype="F16", n_split=3, **_TINY),
        ModelSpec(name="moe", seed=2, n_layer=4, n_embd=256, n_ff=512, n_head=4, n_head_kv=2,
                  n_vocab=384, n_ctx=2048, wtype="F16", n_expert=8, n_expert_used=2),
        ModelSpec(name="qwen3moe", seed=4, n_layer=3, n_embd=256, n_ff=384, n_head=4, n_head_kv=2,
                  n_vocab=384, n_ctx=2048, wtype="F16", n_expert=16, n_expert_used=4, arch="qwen3moe"),
        # Realistic shapes (TinyLlama-like, 32000-token vocab) for overhead measurements.
        ModelSpec(name="bench", seed=3, n_layer=16, n_embd=2048, n_ff=5632, n_head=16, n_head_kv=16,
                  n_vocab=32000, n_ctx=2048, wtype="Q8_0", direct_blocks=True),
    )
}

FILE_TYPES = {"F16": gguf.LlamaFileType.MOSTLY_F16, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}


def gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def log(msg: str) -> None:
    print(f"gen_models: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- vocabulary

def vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """SPM vocabulary: tokens, scores, token types.

    llama.cpp's SPM tokenizer splits text into characters and merges adjacent
    pieces whenever their concatenation is a token, so every word comes with
    all its prefixes ("▁h", "▁he", ... "▁hello") and the single letters;
    anything else falls back to the byte tokens. "hello world" therefore
    tokenizes to [<s>, ▁hello, ▁world]. Filler tokens "[tokN]" pad the
    vocabulary to n_vocab (their brackets never occur in test prompts).
    """
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(T.BYTE)
    pieces = [SPM_SPACE] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    for word in WORDS:
        w = SPM_SPACE + word
        pieces += [w[:i] for i in range(2, len(w) + 1)]
    seen = set(tokens)
    for p in pieces:
        if p not in seen:
            seen.add(p)
            tokens.append(p)
            types.append(T.NORMAL)
    if len(tokens) > n_vocab:
        raise ValueError(f"n_vocab {n_vocab} < {len(tokens)} base tokens")
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(f"[tok{i}]")
        types.append(T.NORMAL)
        i += 1
    # SentencePiece style: special and byte tokens score 0, normal pieces get
    # decreasing negative scores (longer word pieces rank like real merges).
    scores = [0.0 if t != T.NORMAL else -float(k) for k, t in enumerate(types)]
    return tokens, scores, [int(t) for t in types]


# ------------------------------------------------------------------ tensors

@dataclass(frozen=True)
class TensorPlan:
    name: str
    ne: tuple[int, ...]  # ggml order (ne0 = row length), as GGUF stores it
    type: QT
    std: float  # weight scale; 0 means a norm (all ones)

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (rows last-dimension-fastest), in elements."""
        return tuple(reversed(self.ne))

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.type]
        return math.prod(self.ne) // block * size


def tensor_plan(spec: ModelSpec) -> list[TensorPlan]:
    """Every tensor in file order with its ggml shape and type."""
    w = QT[spec.wtype]
    e, f, v, x = spec.n_embd, spec.n_ff, spec.n_vocab, spec.n_expert
    kv = spec.n_head_kv * spec.head_dim
    out = [TensorPlan("token_embd.weight", (e, v), w, 1.0 / math.sqrt(e))]
    for i in range(spec.n_layer):
        b = f"blk.{i}."
        out += [
            TensorPlan(b + "attn_norm.weight", (e,), QT.F32, 0.0),
            TensorPlan(b + "attn_q.weight", (e, e), w, 1.0 / math.sqrt(e)),
            TensorPlan(b + "attn_k.weight", (e, kv), w, 1.0 / math.sqrt(e)),
            TensorPlan(b + "attn_v.weight", (e, kv), w, 1.0 / math.sqrt(e)),
            TensorPlan(b + "attn_output.weight", (e, e), w, 1.0 / math.sqrt(e)),
        ]
        if spec.arch == "qwen3moe":
            out += [
                TensorPlan(b + "attn_k_norm.weight", (spec.head_dim,), QT.F32, 0.0),
                TensorPlan(b + "attn_q_norm.weight", (spec.head_dim,), QT.F32, 0.0),
            ]
        out += [
            TensorPlan(b + "ffn_norm.weight", (e,), QT.F32, 0.0),
        ]
        if x:
            out += [
                # The router stays F32, as llama.cpp's converters keep it.
                TensorPlan(b + "ffn_gate_inp.weight", (e, x), QT.F32, 1.0 / math.sqrt(e)),
                TensorPlan(b + "ffn_gate_exps.weight", (e, f, x), w, 1.0 / math.sqrt(e)),
                TensorPlan(b + "ffn_up_exps.weight", (e, f, x), w, 1.0 / math.sqrt(e)),
                TensorPlan(b + "ffn_down_exps.weight", (f, e, x), w, 1.0 / math.sqrt(f)),
            ]
        else:
            out += [
                TensorPlan(b + "ffn_gate.weight", (e, f), w, 1.0 / math.sqrt(e)),
                TensorPlan(b + "ffn_up.weight", (e, f), w, 1.0 / math.sqrt(e)),
                TensorPlan(b + "ffn_down.weight", (f, e), w, 1.0 / math.sqrt(f)),
            ]
    out += [
        TensorPlan("output_norm.weight", (e,), QT.F32, 0.0),
        TensorPlan("output.weight", (e, v), w, 1.0 / math.sqrt(e)),
    ]
    return out


def tensor_data(spec: ModelSpec, index: int, t: TensorPlan) -> np.ndarray:
    """The bytes of tensor `index` as the array handed to GGUFWriter.

    F32/F16: arrays in numpy shape. Quantized: uint8 arrays whose last
    dimension is the row's byte length (GGUFWriter's raw layout).
    """
    rng = np.random.default_rng([spec.seed, index])
    if t.std == 0.0:
        return np.ones(t.shape, dtype=np.float32)
    if spec.direct_blocks and t.type == QT.Q8_0:
        return q8_0_blocks(rng, t)
    vals = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(t.std)
    if t.type == QT.F32:
        return vals
    if t.type == QT.F16:
        return vals.astype(np.float16)
    return gguf.quants.quantize(vals, t.type)


def q8_0_blocks(rng: np.random.Generator, t: TensorPlan) -> np.ndarray:
    """Valid Q8_0 blocks drawn directly: fp16 scale d + 32 int8 quants, with
    d chosen so the weights d*q have about standard deviation t.std."""
    rows = math.prod(t.shape[:-1])
    nb = t.ne[0] // 32
    base = t.std * math.sqrt(3.0) / 127.0  # uniform q in [-127, 127] has std 127/sqrt(3)
    d = (rng.uniform(0.75, 1.25, (rows, nb)) * base).astype(np.float16)
    q = rng.integers(-127, 128, (rows, nb, 32), dtype=np.int8)
    blocks = np.empty((rows, nb, 34), dtype=np.uint8)
    blocks[:, :, :2] = d.view(np.uint8).reshape(rows, nb, 2)
    blocks[:, :, 2:] = q.view(np.uint8)
    return blocks.reshape(*t.shape[:-1], nb * 34)


# ------------------------------------------------------------- metadata (KV)

def expected_kv(spec: ModelSpec) -> dict[str, object]:
    """The metadata every model carries (first shard for split models)."""
    tokens, scores, types = vocab(spec.n_vocab)
    a = spec.arch
    kv: dict[str, object] = {
        "general.architecture": a,
        "general.name": spec.name,
        "general.description": f"ttrace synthetic test model (gen_models.py v{GENERATOR_VERSION}, seed {spec.seed})",
        "general.file_type": int(FILE_TYPES[spec.wtype]),
        f"{a}.vocab_size": spec.n_vocab,
        f"{a}.context_length": spec.n_ctx,
        f"{a}.embedding_length": spec.n_embd,
        f"{a}.block_count": spec.n_layer,
        f"{a}.feed_forward_length": spec.n_ff,
        f"{a}.attention.head_count": spec.n_head,
        f"{a}.attention.head_count_kv": spec.n_head_kv,
        f"{a}.attention.layer_norm_rms_epsilon": spec.rms_eps,
        f"{a}.rope.dimension_count": spec.head_dim,
        f"{a}.rope.freq_base": spec.rope_freq_base,
    }
    if spec.wtype != "F16":
        kv["general.quantization_version"] = gguf.GGML_QUANT_VERSION
    if spec.n_expert:
        kv[f"{a}.expert_count"] = spec.n_expert
        kv[f"{a}.expert_used_count"] = spec.n_expert_used
    if a == "qwen3moe":
        kv[f"{a}.expert_feed_forward_length"] = spec.n_ff
    kv.update({
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": BOS_ID,
        "tokenizer.ggml.eos_token_id": EOS_ID,
        "tokenizer.ggml.unknown_token_id": UNK_ID,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
    })
    return kv


def add_kv(w: gguf.GGUFWriter, spec: ModelSpec) -> None:
    kv = expected_kv(spec)
    w.add_name(kv["general.name"])
    w.add_description(kv["general.description"])
    w.add_file_type(kv["general.file_type"])
    if "general.quantization_version" in kv:
        w.add_quantization_version(kv["general.quantization_version"])
    w.add_vocab_size(spec.n_vocab)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(spec.rope_freq_base)
    if spec.n_expert:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
    if spec.arch == "qwen3moe":
        w.add_expert_feed_forward_length(spec.n_ff)
    w.add_tokenizer_model("llama")
    w.add_token_list(kv["tokenizer.ggml.tokens"])
    w.add_token_scores(kv["tokenizer.ggml.scores"])
    w.add_token_types(kv["tokenizer.ggml.token_type"])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


# ------------------------------------------------------------------ writing

def shard_paths(out: Path, spec: ModelSpec) -> list[Path]:
    """The files of a model, first (manifest) file first; llama.cpp's naming."""
    if spec.n_split == 1:
        return [out / f"{spec.name}.gguf"]
    return [out / gguf.gguf_writer.SHARD_NAME_FORMAT.format(spec.name, i + 1, spec.n_split)
            for i in range(spec.n_split)]


def split_max_tensors(spec: ModelSpec) -> int:
    return 0 if spec.n_split == 1 else -(-len(tensor_plan(spec)) // spec.n_split)


def write_model(spec: ModelSpec, out_dir: Path) -> list[Path]:
    """Write the model into out_dir (a scratch dir); return its files."""
    plan = tensor_plan(spec)
    w = gguf.GGUFWriter(out_dir / f"{spec.name}.gguf", spec.arch, split_max_tensors=split_max_tensors(spec))
    add_kv(w, spec)
    for t in plan:
        if t.type in (QT.F32, QT.F16):
            dtype, shape = (np.float32 if t.type == QT.F32 else np.float16), t.shape
        else:
            dtype, shape = np.uint8, gguf.quant_shape_to_byte_shape(t.shape, t.type)
        w.add_tensor_info(t.name, shape, np.dtype(dtype), t.nbytes, raw_dtype=t.type)
    if len(w.tensors) != spec.n_split:
        raise RuntimeError(f"{spec.name}: writer planned {len(w.tensors)} shards, spec says {spec.n_split}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # Stream tensor by tensor so the 1 GB model never sits in memory whole.
    total, done, last = sum(t.nbytes for t in plan), 0, time.monotonic()
    for i, t in enumerate(plan):
        data = tensor_data(spec, i, t)
        assert data.nbytes == t.nbytes, (t.name, data.nbytes, t.nbytes)
        w.write_tensor_data(data)
        done += t.nbytes
        if time.monotonic() - last > 5:
            log(f"  {spec.name}: {done / total:.0%} of {total / 1e6:.0f} MB")
            last = time.monotonic()
    w.close()
    files = shard_paths(out_dir, spec)
    missing = [p for p in files if not p.exists()]
    if missing:
        raise RuntimeError(f"{spec.name}: writer did not produce {missing}")
    return files


def sidecar(out: Path, spec: ModelSpec) -> Path:
    return out / f"{spec.name}.params.json"


def is_current(out: Path, spec: ModelSpec) -> bool:
    try:
        rec = json.loads(sidecar(out, spec).read_text())
    except (OSError, ValueError):
        return False
    if rec.get("params") != json.loads(json.dumps(spec.params())):
        return False
    files = rec.get("files", {})
    wanted = [p.name for p in shard_paths(out, spec)]
    if sorted(files) != sorted(wanted):
        return False
    return all((out / n).is_file() and (out / n).stat().st_size == size for n, size in files.items())


def ensure_model(spec: ModelSpec, out: Path, force: bool = False) -> Path:
    files = shard_paths(out, spec)
    if not force and is_current(out, spec):
        log(f"{spec.name}: ok (cached)")
        return files[0].resolve()
    t0 = time.monotonic()
    log(f"{spec.name}: generating ({spec.n_layer} layers, {spec.wtype}"
        + (f", {spec.n_split} shards" if spec.n_split > 1 else "") + ")")
    # Drop the record first: from here until the new one is written the
    # model counts as incomplete, whatever happens.
    side = sidecar(out, spec)
    try:
        old = json.loads(side.read_text()).get("files", {})
    except (OSError, ValueError):
        old = {}
    side.unlink(missing_ok=True)
    for name in old:
        (out / name).unlink(missing_ok=True)
    tmp = out / f".tmp-{spec.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    written = write_model(spec, tmp)
    sizes = {}
    for p in written:
        sizes[p.name] = p.stat().st_size
        os.replace(p, out / p.name)
    shutil.rmtree(tmp, ignore_errors=True)
    rec = {"params": spec.params(), "files": sizes}
    side_tmp = side.with_name(side.name + ".tmp")
    side_tmp.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
    os.replace(side_tmp, side)
    mb = sum(sizes.values()) / 1e6
    log(f"{spec.name}: wrote {mb:.1f} MB in {time.monotonic() - t0:.1f}s")
    return files[0].resolve()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for the models (created)")
    ap.add_argument("--only", nargs="+", choices=sorted(SPECS), help="generate only these models")
    ap.add_argument("--force", action="store_true", help="regenerate even if cached")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name in args.only or SPECS:
        manifest[name] = str(ensure_model(SPECS[name], out, args.force))
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
