"""Graph capture (the default mode) against llama.cpp's own eval callback:
per ubatch, the nodes ttrace records (op, name) are the nodes the scheduler
computed, in order, and the GET_ROWS indices ttrace records are the token
ids llama.cpp embedded. The oracle (graph_oracle.py with --oracle) and the
traced run (the same script, untouched) decode greedily on the same build and
thread count, so both compute the same tokens. The same run checks the
weight bytes charged per op, ubatch, tensor, layer and component against the
oracle's GET_ROWS rows and MoE routing. Needs root."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from test_exports import export

ORACLE = Path(__file__).with_name("graph_oracle.py")
# Nodes ggml_graph_compute skips: they compute nothing (views, reshapes).
EMPTY_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


def oracle_run(model: Path, out: Path | None, n: int) -> list[str]:
    args = [sys.executable, ORACLE, model, "-n", str(n), "--threads", "2"]
    return args + (["--oracle", str(out)] if out else [])


# moe-stand-ins: the programs of kernels before 5.15 (TTRACE_STAND_INS: as if
# this one lacked bpf_get_attach_cookie and bpf_loop), the graph walked by a
# bounded loop.
@pytest.mark.parametrize("name", ["tiny", "moe", "qwen3moe", "gemma", "moe-stand-ins"])
def test_graph_nodes_and_token_ids_match_the_eval_callback(ttrace, tmp_path, models, monkeypatch, name):
    if name.endswith("-stand-ins"):
        monkeypatch.setenv("TTRACE_STAND_INS", "cookie,loop")
        name = name.removesuffix("-stand-ins")
    oracle_json = tmp_path / "oracle.json"
    proc = subprocess.run(oracle_run(models[name], oracle_json, 4), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    oracle = json.loads(oracle_json.read_text())

    trace = tmp_path / "t.data"
    traced = subprocess.run([ttrace, "run", "-o", trace, "--", *oracle_run(models[name], None, 4)],
                            capture_output=True, text=True, timeout=600)
    assert traced.returncode == 0, traced.stderr[-3000:]
    # The same greedy decode: the traced run generated the oracle's tokens.
    assert json.loads(traced.stdout.strip().splitlines()[-1])["generated"] == oracle["generated"]

    rows = export(ttrace, trace, "jsonl", tmp_path / "rows.jsonl")
    by_ubatch: dict[int, list[dict]] = {}
    for line in rows.read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "op" and r["ubatch"] is not None:
            by_ubatch.setdefault(r["ubatch"], []).append(r)
    assert sorted(by_ubatch) == list(range(len(oracle["ubatches"])))
    for u, nodes in enumerate(oracle["ubatches"]):
        want = [(n["op"], n["name"]) for n in nodes if n["op"] not in EMPTY_OPS]
        got = [(r["name"], r["dst"]) for r in by_ubatch[u]]
        diff = next((i for i in range(max(len(got), len(want))) if got[i:i + 1] != want[i:i + 1]), None)
        assert diff is None, f"ubatch {u}, node {diff}: ttrace {got[diff:diff + 3]}, llama.cpp {want[diff:diff + 3]}"
        # The embedding's indices: the prompt's tokens, then each generated one.
        want_tokens = oracle["prompt_tokens"] if u == 0 else [oracle["generated"][u - 1]]
        embd = [n for n in nodes if n.get("src0") == "token_embd.weight"]
        assert [n["rows"] for n in embd] == [want_tokens]
    report = json.loads(subprocess.run([ttrace, "report", trace, "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    assert [u["token_ids"] for u in report["ubatches"]] == [oracle["prompt_tokens"]] + [[t] for t in oracle["generated"]]

    # MoE routing: per ubatch, layer and row, the ranking llama.cpp computed
    # in ffn_moe_argsort-L, and the first expert_used_count of it selected.
    reader = gguf.GGUFReader(models[name])
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    used = reader.fields.get(f"{arch}.expert_used_count")
    k = int(used.parts[-1][0]) if used else 0
    per_op: dict[int, dict[tuple[str, str], int]] = {}  # ubatch -> (op, weight) -> bytes read
    routed_by_ubatch: dict[int, dict[int, set[int]]] = {}  # ubatch -> layer -> experts routed to
    for u, nodes in enumerate(oracle["ubatches"]):
        want = {}
        for n in nodes:
            if n["name"].startswith("ffn_moe_argsort"):
                layer, width = int(n["name"].rsplit("-", 1)[1]), n["shape"][0]
                for row in range(len(n["ids"]) // width):
                    want[(layer, row)] = n["ids"][row * width:(row + 1) * width]
        got = {(r["layer"], r["row"]): r["ranking"] for r in report["ubatches"][u]["routing"]}
        assert got == want, f"ubatch {u}: routing differs"
        assert all(r["selected"] == r["ranking"][:k] for r in report["ubatches"][u]["routing"])
        assert bool(want) == (k > 0), "MoE models route every ubatch, dense ones never"

        # Weight bytes per ubatch, from the oracle and the GGUF table alone:
        # the embedding reads one row per token id, an expert tensor the
        # slices of the experts its layer's tokens were routed to. The
        # report, the row export and tokens-json all say so.
        (model,) = report["models"]
        names = [t["name"] for t in model["tensors"]]
        table = {t.name: t for t in reader.tensors}
        bytes_of = {names[w["tensor"]]: w["bytes"] for w in report["ubatches"][u]["weights"]}
        embd = table["token_embd.weight"]
        n_rows = int(embd.shape[1])  # gguf-py: shape in ggml order (ne0, ne1)
        n_ids = len([n for n in nodes if n.get("src0") == "token_embd.weight"][0]["rows"])
        lookup = n_ids * int(embd.n_bytes) // n_rows
        if "output.weight" in table:  # (Gemma's output projection reads the whole table)
            assert bytes_of["token_embd.weight"] == lookup
        routed = {}
        for (layer, _), ranking in want.items():
            routed.setdefault(layer, set()).update(ranking[:k])
        routed_by_ubatch[u] = routed
        expert_bytes = {}
        for tname, t in table.items():
            if tname.endswith("_exps.weight"):
                layer = int(tname.split(".")[1])
                expert_bytes[tname] = len(routed[layer]) * int(t.n_bytes) // int(t.shape[-1])
                assert bytes_of[tname] == expert_bytes[tname], (u, tname)
        assert bool(expert_bytes) == (k > 0)
        per_op[u] = {("GET_ROWS", "token_embd.weight"): lookup,
                     **{("MUL_MAT_ID", tname): b for tname, b in expert_bytes.items()}}

    for u, ops in by_ubatch.items():
        for r in ops:
            want_bytes = per_op[u].get((r["name"], r["srcs"].split(";")[0]))
            if want_bytes is not None:
                assert r["weight_bytes"] == want_bytes, (u, r["name"], r["srcs"])
    # tokens-json: the same bytes read, and each expert op's expert_ids the
    # experts its layer's tokens were routed to.
    tokens_dir = export(ttrace, trace, "tokens-json", tmp_path / "tokens")
    checked = experts_checked = 0
    for doc in map(json.loads, map(Path.read_text, (tokens_dir / "traces").glob("*.json"))):
        u = doc["ubatch"]
        for entry in doc["entries"]:
            src = entry["sources"][0]
            want_bytes = per_op[u].get((entry["operation_type"], src["name"]))
            if want_bytes is not None:
                assert src["bytes_read"] == want_bytes, (u, entry["dst_name"])
                checked += 1
            if entry["operation_type"] == "MUL_MAT_ID":
                layer = int(src["name"].split(".")[1])
                assert sorted(entry["expert_ids"]) == sorted(routed_by_ubatch[u][layer]), (u, entry["dst_name"])
                experts_checked += 1
    assert checked >= len(oracle["ubatches"])
    assert bool(experts_checked) == (k > 0)

    # The report's per-tensor, layer and component tables charge what the
    # ubatches charge: over the generate ubatches they sum to their
    # weight_bytes to the byte, the embedding is the rows looked up and an
    # expert tensor the routed experts' slices, as the oracle says.
    stats = report["stats"]
    generate = [u["index"] for u in stats["ubatches"] if u["phase"] == "generate"]
    assert generate == list(range(1, len(oracle["ubatches"])))
    total = sum(stats["ubatches"][u]["weight_bytes"] for u in generate)
    for key in ("tensors", "layers", "components"):
        assert sum(g["generate_weight_bytes"] for g in stats[key]) == total, key
        for g in stats[key]:
            assert g["bytes_per_token"] == pytest.approx(g["generate_weight_bytes"] / len(generate)), g
    charged = {t["name"]: t for t in stats["tensors"]}
    if "output.weight" in table:
        rows = sum(per_op[u][("GET_ROWS", "token_embd.weight")] for u in generate)
        (embd_component,) = [g for g in stats["components"] if g["key"] == "token_embd"]
        assert charged["token_embd.weight"]["generate_weight_bytes"] == embd_component["generate_weight_bytes"] == rows
    for tname in (t for t in table if t.endswith("_exps.weight")):
        routed_slices = sum(per_op[u][("MUL_MAT_ID", tname)] for u in generate)
        assert charged[tname]["generate_weight_bytes"] == routed_slices, tname
        assert not charged[tname]["upper_bound"], tname
    assert not any(g["upper_bound"] for g in stats["components"] + stats["layers"])
