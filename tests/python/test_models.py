"""Read every generated model back with the `gguf` package's reader and
compare with what scripts/gen_models.py intended: metadata, tensor names,
shapes, types, sizes, offsets (alignment) and, where cheap, the bytes.
Also: generation is deterministic and the cache regenerates only when needed.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from conftest import GEN_MODELS, load_gen_models

GEN = load_gen_models()
ALL = sorted(GEN.SPECS)

# Block size / bytes per block, written out independently of the gguf
# package (ggml's type traits; see notes/ggml-and-environment.md section 7).
BLOCKS = {QT.F32: (1, 4), QT.F16: (1, 2), QT.Q4_0: (32, 18), QT.Q8_0: (32, 34)}


def pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def shards(models, name):
    spec = GEN.SPECS[name]
    files = GEN.shard_paths(models[name].parent, spec)
    assert files[0] == models[name], "manifest entry must be the first shard"
    return spec, files


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def test_manifest_lists_every_spec(models):
    # Every generated model, the real ones set-up fetches, and SmolLM2 in F16.
    assert sorted(models) == sorted([*ALL, "gemma", "smollm2"])


@pytest.mark.parametrize("name", ALL)
def test_metadata(models, name):
    spec, files = shards(models, name)
    first = GGUFReader(files[0])
    for key, want in GEN.expected_kv(spec).items():
        got = field(first, key)
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-6), key
        elif isinstance(want, list) and want and isinstance(want[0], float):
            assert np.allclose(got, want), key
        else:
            assert got == want, key
    tokens = field(first, "tokenizer.ggml.tokens")
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert "\u2581hello" in tokens and "\u2581world" in tokens
    assert len(tokens) == spec.n_vocab == len(set(tokens))


@pytest.mark.parametrize("name", ALL)
def test_tensor_table(models, name):
    """Names, shapes, types in order; offsets = previous + padded size."""
    spec, files = shards(models, name)
    plan = GEN.tensor_plan(spec)
    seen = []
    for i, path in enumerate(files):
        r = GGUFReader(path)
        if len(files) > 1:
            assert field(r, "split.no") == i
            assert field(r, "split.count") == len(files)
            assert field(r, "split.tensors.count") == len(plan)
        align = field(r, "general.alignment") or 32
        assert r.alignment == align == 32
        assert r.data_offset % align == 0
        rel = 0
        for t in r.tensors:
            want = plan[len(seen)]
            assert t.name == want.name
            assert tuple(int(d) for d in t.shape) == want.ne, t.name
            assert t.tensor_type == want.type, t.name
            block, size = BLOCKS[want.type]
            nbytes = math.prod(want.ne) // block * size
            assert t.n_bytes == nbytes == want.nbytes, t.name
            assert int(t.field.parts[-1][0]) == rel, f"{t.name}: relative offset"
            assert t.data_offset == r.data_offset + rel
            assert t.data_offset % align == 0
            rel += pad(nbytes, align)
            seen.append(t.name)
        assert path.stat().st_size == r.data_offset + rel, f"{path.name}: size"
    assert seen == [t.name for t in plan]
    # The matrices carry the model's type; norms (and the MoE router) are F32.
    types = {t.type for t in plan if t.type != QT.F32}
    assert types == {QT[spec.wtype]}
    if spec.n_expert:
        exps = [t for t in plan if "_exps." in t.name]
        assert len(exps) == 3 * spec.n_layer and all(t.ne[2] == spec.n_expert for t in exps)


def _sample(plan, name):
    """Which tensors to compare byte for byte: all of the small models,
    a few of bench (regenerating 1 GB would take a while)."""
    if GEN.SPECS[name].n_embd < 1024:
        return list(range(len(plan)))
    return [0, 1, 2, 3, len(plan) - 2]


@pytest.mark.parametrize("name", ALL)
def test_tensor_bytes_as_generated(models, name):
    spec, files = shards(models, name)
    plan = GEN.tensor_plan(spec)
    tensors = [t for p in files for t in GGUFReader(p).tensors]
    for i in _sample(plan, name):
        want = GEN.tensor_data(spec, i, plan[i])
        assert tensors[i].data.tobytes() == want.tobytes(), plan[i].name


def test_family_shares_weights(models):
    """tiny-split holds exactly tiny's tensors; tiny-q8 is tiny quantized."""
    tiny = GGUFReader(models["tiny"]).tensors
    _, files = shards(models, "tiny-split")
    split = [t for p in files for t in GGUFReader(p).tensors]
    assert [t.name for t in split] == [t.name for t in tiny]
    for a, b in zip(tiny, split):
        assert a.data.tobytes() == b.data.tobytes(), a.name
    q8 = {t.name: t for t in GGUFReader(models["tiny-q8"]).tensors}
    from gguf.quants import dequantize

    w = tiny[1 + 1]  # blk.0.attn_q.weight
    assert w.name == "blk.0.attn_q.weight"
    deq = dequantize(q8[w.name].data, QT.Q8_0)
    assert np.allclose(deq, w.data.astype(np.float32), atol=2e-3)


def test_q8_blocks_are_sane(models):
    """bench's directly written Q8_0 blocks: finite small scales, weights of
    the intended magnitude."""
    spec = GEN.SPECS["bench"]
    plan = GEN.tensor_plan(spec)
    t = GGUFReader(models["bench"]).tensors[2]
    blocks = t.data.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32).ravel()
    assert np.isfinite(d).all() and (d > 0).all() and d.max() < 1e-3
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    std = float((q * d[:, None]).std())
    assert std == pytest.approx(plan[2].std, rel=0.1)


def test_deterministic_and_stdout_is_only_the_manifest(models, tmp_path):
    """Same parameters => byte-identical files, through the real CLI."""
    names = ["tiny", "tiny-q4", "tiny-split", "moe"]
    out = subprocess.run(
        [sys.executable, str(GEN_MODELS), "--out", str(tmp_path), "--only", *names],
        check=True, capture_output=True, text=True,
    )
    manifest = json.loads(out.stdout)  # nothing but JSON on stdout
    assert sorted(manifest) == sorted(names)
    for name in names:
        _, cached = shards(models, name)
        fresh = GEN.shard_paths(tmp_path, GEN.SPECS[name])
        assert manifest[name] == str(fresh[0])
        for a, b in zip(cached, fresh):
            assert sha256(a) == sha256(b), f"{name}: {b.name} differs from the cached {a}"


def test_cache_reuses_and_repairs(tmp_path):
    spec = GEN.SPECS["tiny-split"]
    files = GEN.shard_paths(tmp_path, spec)
    GEN.ensure_model(spec, tmp_path)
    stamp = [p.stat().st_mtime_ns for p in files]
    GEN.ensure_model(spec, tmp_path)
    assert [p.stat().st_mtime_ns for p in files] == stamp, "unchanged params must not regenerate"
    # An incomplete shard (e.g. a disk-full copy) is detected by its size.
    good = files[1].read_bytes()
    files[1].write_bytes(good[:1000])
    GEN.ensure_model(spec, tmp_path)
    assert files[1].read_bytes() == good
    # Another generator version (or spec) regenerates.
    side = GEN.sidecar(tmp_path, spec)
    rec = json.loads(side.read_text())
    rec["params"]["generator_version"] = -1
    side.write_text(json.dumps(rec))
    assert not GEN.is_current(tmp_path, spec)
    GEN.ensure_model(spec, tmp_path)
    assert GEN.is_current(tmp_path, spec)
    # An interrupted run leaves no record, so the model counts as missing;
    # nothing half-written ever has the final name.
    side.unlink()
    assert not GEN.is_current(tmp_path, spec)
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())
