"""Access-pattern research on exact data: the MoE section of `ttrace report`,
`ttrace export --format mbolt` read by mbolt's own parser (PyPI `mbolt`,
pinned), loaded vs used against the token ids llama.cpp itself embedded and
the GGUF table (gguf-py), and `ttrace diff` across mbolt's layout rewrite.
Needs root: the traces are recorded here."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from mbolt.trace import read_trace

from test_exports import CHROMIUM_FLAGS

ORACLE = Path(__file__).with_name("graph_oracle.py")
VENV_BIN = Path(sys.executable).parent
PROMPT = "hello world, the quick brown fox"
# Greedy decoding takes the highest logit, so rounding can change a token only
# where the best two logits are closer than rounding moves them. mbolt's
# rewrite permutes the experts, and that changes rounding in llama.cpp on some
# CPUs: AVX2 builds sum the router's 8 softmax terms in a float32 tree whose
# order follows the experts' positions (1 ulp in ffn_moe_probs), and the F16
# matmuls' rounding of their inputs magnifies that to up to 1.6e-3 in the
# logits; AVX-512 builds sum them in double and compute identical values. A
# gap under this margin is a near-tie whose token may differ between the runs.
GREEDY_TIE = 5e-3
# The runs must agree on every generated token before the first near-tie, and
# that must be most of them, so that a near-tie early in the text (after a
# change of model or prompt) cannot hollow the comparison out. llama.cpp's own
# logits on this model and prompt have none in the 24 tokens (smallest gap
# 8.8e-3, AVX-512 and AVX2 builds alike).
MIN_SURE_TOKENS = 16
EXPERT_TENSOR = re.compile(r"blk\.(\d+)\.ffn_(gate_inp|up_exps|gate_exps|down_exps)\.weight")


def report(ttrace, trace: Path) -> dict:
    out = subprocess.run([ttrace, "report", trace, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def arch_field(reader: gguf.GGUFReader, key: str) -> int | None:
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    f = reader.fields.get(f"{arch}.{key}")
    return int(f.parts[-1][0]) if f else None


def completion(ttrace, out: Path, llama_completion, model: Path, preload: Path, n: int, extra=()) -> str:
    """Trace llama-completion greedily (`--temp 0`: its default samples at
    temperature 0.8); its stdout (the text)."""
    argv = [ttrace, "run", "--drop-caches", *extra, "-o", out, "--", llama_completion, "-m", model, "-p", PROMPT,
            "-n", str(n), "-no-cnv", "--ignore-eos", "-t", "2", "--temp", "0", "-c", "256"]
    env = dict(os.environ, LD_PRELOAD=str(preload))
    proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", env=env, timeout=600)
    assert proc.returncode == 0, f"ttrace run failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize("name,load", [("tiny", "mmap"), ("tiny", "no-mmap"), ("gemma", "mmap")])
def test_loaded_but_never_used_embedding_rows(ttrace, tmp_path, models, name, load):
    """With a cold cache, the whole embedding table is loaded (MAP_POPULATE, or
    read into a buffer), and the bytes never used are the table minus the rows
    of the token ids llama.cpp embedded, as the untouched run itself prints
    them, from gguf-py's table. Gemma's output projection reads the whole
    table, so nothing of it is unused."""
    out = tmp_path / "t.data"
    # A private copy: --drop-caches cannot evict pages another process has
    # mapped, and anything else running the shared model keeps them cached.
    model = tmp_path / models[name].name
    shutil.copyfile(models[name], model)
    script = [sys.executable, ORACLE, model, "-n", "6", "--threads", "2"]
    script += ["--no-mmap"] if load == "no-mmap" else []
    # --model: not on a llama.cpp command line, so named to be watched from the start.
    proc = subprocess.run([ttrace, "run", "--drop-caches", "--model", model, "-o", out, "--", *script],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    used_ids = set(printed["prompt_tokens"]) | set(printed["generated"])

    table = {t.name: t for t in gguf.GGUFReader(models[name]).tensors}
    embd = table["token_embd.weight"]
    row = int(embd.n_bytes) // int(embd.shape[1])  # gguf-py: shape in ggml order (ne0, ne1)
    u = report(ttrace, out)["stats"]["loaded_vs_used"]
    assert u["caches_dropped"] and u["load_mode"] == ("no_mmap" if load == "no-mmap" else "default")
    t = next(t for t in u["tensors"] if t["name"] == "token_embd.weight")
    assert t["size_bytes"] == embd.n_bytes
    assert t["loaded"] == embd.n_bytes, "a cold start loads the whole table"
    if "output.weight" in table:
        want = int(embd.n_bytes) - len(used_ids) * row
        assert abs(t["loaded_unused"] - want) <= len(used_ids) * 4096, (t, want)
        assert t["used"] == len(used_ids) * row and t["loaded_unused"] == want
    else:
        assert t["loaded_unused"] == 0 and t["used"] == embd.n_bytes
    # The totals are the sums of the parts, and nothing is used that was not loaded.
    for key in ["size_bytes", "loaded", "used", "loaded_unused"]:
        assert u["total"][key] == sum(x[key] for x in u["tensors"]) == sum(x[key] for x in u["layers"])
    assert all(x["loaded_unused"] <= x["loaded"] and x["used"] <= x["size_bytes"] for x in u["tensors"])


def decode_from_report(a: dict) -> list[list[list[int]]]:
    generate = [u for u in a["ubatches"] if u["phase"] == "generate"]
    return [[r["selected"] for r in sorted(u["routing"], key=lambda r: r["layer"])] for u in generate]


def stickiness(decode: np.ndarray, layer: int) -> float:
    kept = sum(len(set(decode[t, layer]) & set(decode[t + 1, layer])) for t in range(len(decode) - 1))
    return kept / sum(len(decode[t, layer]) for t in range(len(decode) - 1))


@pytest.mark.parametrize("name", ["moe", "qwen3moe"])
def test_mbolt_reads_the_routing_export(ttrace, tmp_path, llama_completion, models, flush_log_preload, name):
    """mbolt's own parser reads the MBLT export; its decode array is the routing
    of the generated tokens (which test_graph_capture holds equal to the eval
    callback's), its prefill the prompt's; `mbolt-sim cluster` turns it into
    per-layer permutations. The report's MoE section agrees with figures
    computed here from mbolt's array."""
    trace = tmp_path / "t.data"
    completion(ttrace, trace, llama_completion, models[name], flush_log_preload, 16)
    a = report(ttrace, trace)
    mblt = tmp_path / "routing.mblt"
    subprocess.run([ttrace, "export", trace, "--format", "mbolt", "-o", mblt], check=True, capture_output=True)
    t = read_trace(str(mblt))
    reader = gguf.GGUFReader(models[name])
    n_layer, k = arch_field(reader, "block_count"), arch_field(reader, "expert_used_count")
    assert (t.n_expert, t.k, t.n_layers) == (arch_field(reader, "expert_count"), k, n_layer)
    assert t.decode.tolist() == decode_from_report(a)
    assert len(t.decode) == sum(u["phase"] == "generate" for u in a["ubatches"]) == 15
    prompt = [u for u in a["ubatches"] if u["phase"] == "prompt"]
    assert t.prefill_per_layer[0].shape == (sum(u["n_tokens"] for u in prompt), k)

    perms = tmp_path / "perms.json"
    proc = subprocess.run([VENV_BIN / "mbolt-sim", "cluster", mblt, "-o", perms, "--min-tokens", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    layers = json.loads(perms.read_text())["layers"]
    assert len(layers) == n_layer
    assert all(sorted(l["chain_perm"]) == list(range(t.n_expert)) for l in layers)

    moe = a["stats"]["moe"]
    assert [l["layer"] for l in moe["layers"]] == list(range(n_layer))
    for l in moe["layers"]:
        gen = next(p for p in l["phases"] if p["phase"] == "generate")
        want = np.bincount(t.decode[:, l["layer"]].ravel(), minlength=t.n_expert).tolist()
        assert gen["activations"] == want and gen["tokens"] == len(t.decode)
        assert gen["stickiness"] == pytest.approx(stickiness(t.decode, l["layer"]))
        pairs = {}
        for ids in t.decode[:, l["layer"]]:
            for i, x in enumerate(ids):
                for y in ids[i + 1:]:
                    key = (int(min(x, y)), int(max(x, y)))
                    pairs[key] = pairs.get(key, 0) + 1
        assert {(p[0], p[1]): p[2] for p in gen["pairs"]} == pairs
        assert len(l["experts"]) == t.n_expert and all(e["size_bytes"] > 0 for e in l["experts"])
    text = subprocess.run([ttrace, "report", trace], capture_output=True, text=True, check=True).stdout
    assert "MoE routing" in text and "stickiness" in text and "loaded vs used" in text
    # The HTML page draws one activation / co-activation grid per layer and phase.
    dom = rendered_html(ttrace, trace, tmp_path)
    assert f'data-moe-grids="{2 * n_layer}"' in dom and 'data-usage-rows="' in dom


def rendered_html(ttrace, trace: Path, tmp_path: Path) -> str:
    html = tmp_path / "report.html"
    subprocess.run([ttrace, "report", trace, "--html", html], capture_output=True, check=True)
    chromium = shutil.which("chromium")
    if not chromium:
        pytest.fail("chromium is not installed: `apt-get install chromium` (cargo xtask setup does)", pytrace=False)
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    assert 'data-rendered="ok"' in dom.stdout
    assert "CONSOLE" not in dom.stderr, [l for l in dom.stderr.splitlines() if "CONSOLE" in l]
    return dom.stdout


def test_no_moe_section_and_no_mbolt_export_without_routing(ttrace, tmp_path, llama_completion, models,
                                                            flush_log_preload):
    trace = tmp_path / "t.data"
    completion(ttrace, trace, llama_completion, models["tiny"], flush_log_preload, 4)
    assert report(ttrace, trace)["stats"]["moe"] is None
    text = subprocess.run([ttrace, "report", trace], capture_output=True, text=True, check=True).stdout
    assert "MoE routing" not in text and "loaded vs used" in text
    assert "data-moe-grids" not in rendered_html(ttrace, trace, tmp_path)
    out = tmp_path / "x.mblt"
    proc = subprocess.run([ttrace, "export", trace, "--format", "mbolt", "-o", out], capture_output=True, text=True)
    assert proc.returncode != 0 and "no MoE routing" in proc.stderr, proc.stderr
    assert not out.exists()


def greedy_oracle(model: Path, n: int) -> dict:
    """llama.cpp's own greedy decode of PROMPT, untraced and without an eval
    callback (graph_oracle.py, the context llama-completion gets): prompt
    tokens, generated tokens and each one's two best logits."""
    argv = [sys.executable, ORACLE, model, "--prompt", PROMPT, "-n", str(n), "--ctx", "256", "--threads", "2", "--top2"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_expert_permutation(original: Path, rewritten: Path, perm: np.ndarray) -> None:
    """gguf-py on both files: the rewrite holds every tensor of the original,
    byte for byte, except that each layer's expert tensors and router rows are
    reordered by mbolt's permutation (position p holds expert perm[p]); every
    metadata key keeps its value (mbolt adds its own, and a 4 KiB alignment)."""
    ra, rb = gguf.GGUFReader(original), gguf.GGUFReader(rewritten)
    a, b = {t.name: t for t in ra.tensors}, {t.name: t for t in rb.tensors}
    assert a.keys() == b.keys()
    permuted = 0
    for name, ta in a.items():
        tb = b[name]
        assert (tb.tensor_type, list(tb.shape)) == (ta.tensor_type, list(ta.shape)), name
        want = np.asarray(ta.data)
        if m := EXPERT_TENSOR.fullmatch(name):
            want = want[perm[int(m.group(1))]]  # numpy's first axis is ggml's last: the experts
            permuted += 1
        assert np.array_equal(want.view(np.uint8), np.asarray(tb.data).view(np.uint8)), f"{name} is not permuted"
    assert permuted == 4 * len(perm)
    for f in ra.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.alignment":
            assert rb.fields[f.name].contents() == f.contents(), f.name


def chain_layout(ttrace, trace: Path, model: Path, out: Path) -> tuple[Path, Path, Path]:
    """mbolt's round trip: the trace's routing exported for mbolt (the .mblt),
    clustered by `mbolt-sim cluster` (perms.json), and `model` rewritten in
    the chain layout (the .chain.gguf), all in `out`."""
    mblt = out / f"{trace.stem}.mblt"
    subprocess.run([ttrace, "export", trace, "--format", "mbolt", "-o", mblt], check=True, capture_output=True)
    perms = out / "perms.json"
    subprocess.run([VENV_BIN / "mbolt-sim", "cluster", mblt, "-o", perms, "--min-tokens", "1"], check=True,
                   capture_output=True, timeout=300)
    rewritten = out / f"{model.stem}.chain.gguf"
    proc = subprocess.run([VENV_BIN / "mbolt", model, perms, "-o", rewritten, "--layout", "chain"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return mblt, perms, rewritten


def test_layout_rewrite_end_to_end(ttrace, tmp_path, llama_completion, models, flush_log_preload):
    """Trace a memory-limited greedy run, export its routing, cluster it and
    rewrite the GGUF with mbolt's chain layout; gguf-py shows the rewrite is a
    pure permutation of the experts. Trace the rewrite with the same prompt and
    limit. Both runs generate llama.cpp's own greedy tokens (an untraced decode
    of each file) up to the first near-tie in its logits, if any, and diverge
    nowhere else; up to there `ttrace diff` finds the same routing under
    mbolt's permutation, as mbolt's own parser does on both exports, and it
    names the first token where they diverge."""
    n, limit = 24, ["--mem-limit", "32M"]
    a_trace, b_trace = tmp_path / "a.data", tmp_path / "b.data"
    # A private copy, cold whatever else maps the shared model (see above).
    original = tmp_path / "moe.gguf"
    shutil.copyfile(models["moe"], original)
    text_a = completion(ttrace, a_trace, llama_completion, original, flush_log_preload, n, limit)
    mblt_a, perms, rewritten = chain_layout(ttrace, a_trace, models["moe"], tmp_path)
    perm = np.array([l["chain_perm"] for l in json.loads(perms.read_text())["layers"]])
    assert_expert_permutation(models["moe"], rewritten, perm)
    text_b = completion(ttrace, b_trace, llama_completion, rewritten, flush_log_preload, n, limit)

    # llama.cpp's own greedy decode of both files: where a token could flip.
    oracle = [greedy_oracle(m, n) for m in (models["moe"], rewritten)]
    top2 = [np.array(o["top2"]) for o in oracle]
    gaps = top2[0][:, 0] - top2[0][:, 1]
    near_ties = np.flatnonzero(gaps < GREEDY_TIE)
    sure = int(near_ties[0]) if len(near_ties) else n
    assert sure >= MIN_SURE_TOKENS, f"near-tie at generated token {sure}: gaps {gaps.round(5).tolist()}"
    assert oracle[0]["generated"][:sure] == oracle[1]["generated"][:sure]
    assert np.abs(top2[0] - top2[1])[:sure].max() < GREEDY_TIE / 2, "the rewrite moved llama.cpp's logits"

    html = tmp_path / "diff.html"
    d = subprocess.run([ttrace, "diff", a_trace, b_trace, "--perm", perms, "--json", "--html", html],
                       capture_output=True, text=True, timeout=300)
    assert d.returncode in (0, 1), d.stderr[-2000:]
    diff = json.loads(d.stdout)
    div = diff["first_divergence"]
    # Generate ubatch i feeds generated token i; the last token is never fed.
    fed = [[r["id"][side] for r in diff["per_token"]] for side in (0, 1)]
    assert len(fed[0]) == len(fed[1]) == n - 1
    assert [r["prompt_tokens"] for r in diff["runs"]] == [len(o["prompt_tokens"]) for o in oracle]
    assert div is None or (div["phase"] == "generate" and div["row"] == 0), div
    same = div["ubatch"] if div else n - 1
    assert fed[0][:same] == fed[1][:same] and (div is None or fed[0][same] != fed[1][same])
    # Identical tokens, llama.cpp's own, up to the first near-tie at least;
    # a divergence only at a near-tie.
    checked = min(sure, n - 1)
    assert same >= checked and fed[0][:checked] == oracle[0]["generated"][:checked]
    assert div is None or gaps[same] < GREEDY_TIE, (div, gaps[same])
    if sure == n:
        assert text_a == text_b and len(text_a) > len(PROMPT)

    # Routing on those tokens: ttrace diff and mbolt's parser, B's expert p being A's perm[p].
    mblt_b = tmp_path / "b.mblt"
    subprocess.run([ttrace, "export", b_trace, "--format", "mbolt", "-o", mblt_b], check=True, capture_output=True)
    ta, tb = read_trace(str(mblt_a)), read_trace(str(mblt_b))
    da, db = ta.decode, tb.decode
    assert da.shape == db.shape == (n - 1, ta.n_layers, ta.k)
    mapped = np.stack([perm[layer][db[:, layer]] for layer in range(ta.n_layers)], axis=1)
    assert (mapped[:same] == da[:same]).all()
    for layer, (pa, pb) in enumerate(zip(ta.prefill_per_layer, tb.prefill_per_layer)):
        assert (perm[layer][pb] == pa).all()
    r = diff["routing"]
    prefill_rows = sum(len(p) for p in ta.prefill_per_layer)
    assert r["permuted"] and r["equal"] == r["compared"] == prefill_rows + same * ta.n_layers
    assert r["after_divergence"] == (n - 1 - same) * ta.n_layers and not r["mismatches"]

    assert d.returncode == (0 if div is None else 1)
    assert diff["same"] == diff["tokens_equal"] == (div is None)
    assert f'data-same="{str(div is None).lower()}"' in html.read_text()
    text = subprocess.run([ttrace, "diff", a_trace, b_trace, "--perm", perms], capture_output=True, text=True)
    assert text.returncode == d.returncode and "disk bytes" in text.stdout
    verdict = "same tokens and routing" if div is None else f"diverge at generated token {same} "
    assert verdict in text.stdout, text.stdout
    # Both runs start cold and map their whole file (MAP_POPULATE), so each
    # reads at least its file from disk; the per-token figures are there.
    for run, model in zip(diff["runs"], (models["moe"], rewritten)):
        assert run["disk_bytes_total"] >= model.stat().st_size and run["disk_bytes_per_token"] is not None
    disk = [r["disk_bytes_per_token"] for r in diff["runs"]]
    print(f"\nsame greedy tokens: {same} of {n - 1} fed (first near-tie: {sure}, smallest top-2 gap "
          f"{gaps.min():.4g}); disk bytes per generated token: original {disk[0]:.0f}, chain layout {disk[1]:.0f}")

    # Without the permutation the routing differs (unless mbolt kept every order).
    plain = subprocess.run([ttrace, "diff", a_trace, b_trace, "--json"], capture_output=True, text=True)
    identity = (perm == np.arange(perm.shape[1])).all()
    assert plain.returncode == (0 if identity and div is None else 1), plain.stderr
    missing = subprocess.run([ttrace, "diff", a_trace, tmp_path / "missing.data"], capture_output=True, text=True)
    assert missing.returncode == 2 and "missing.data" in missing.stderr
