// The selection, in words: one card per selected id (ubatch, token, op,
// tensor, layer, expert, sequence) with its lookup's figures and the links
// that lead to the other views. Each card can clear its part.

import { getJson } from "../api/client";
import type { Ctx } from "../context";
import { changed, type Selection } from "../state";
import { clear, h } from "../ui/dom";
import { bytes, int, ns } from "../ui/format";
import { arr, num, type Obj, obj } from "../ui/json";


export class Details {
  private generation = 0;

  constructor(
    private readonly ctx: Ctx,
    private readonly root: HTMLElement,
  ) {
    ctx.store.subscribe((s, prev) => changed(s.sel, prev.sel) && void this.render());
    void this.render();
  }

  private async render(): Promise<void> {
    const gen = ++this.generation;
    const sel = this.ctx.store.state.sel;
    const cards = await Promise.all([
      this.card("ubatch", sel.ubatch, () => `ubatch/${sel.ubatch}`, (o) => this.ubatch(o)),
      this.card("token", sel.token, () => `token/${sel.token}`, (o) => fields(o, ["token", "token_id", "ubatch", "row", "seq", "pos", "kind"])),
      this.card("op", sel.op, () => `op/${sel.op}`, (o) => this.op(o)),
      this.card("tensor", sel.tensor, () => `tensor/${sel.tensor}`, (o) => this.tensor(o)),
      this.card("layer", sel.layer, () => `layer/${sel.layer}`, (o) => this.layer(o)),
      this.card("expert", sel.expert, () => `expert/${sel.expert![0]}/${sel.expert![1]}`, (o) => this.expert(o)),
      this.card("seq", sel.seq, () => `sequence/${sel.seq}`, (o) => fields(o, ["seq"]).concat([["ubatches", String(arr(o.ubatches).length)], ["tokens", String(arr(o.tokens).length)]])),
    ]);
    if (gen !== this.generation) return;
    clear(this.root);
    const shown = cards.filter((c): c is HTMLElement => c !== null);
    if (!shown.length) this.root.append(h("p", { class: "hint" }, "Click the memory map, a timeline slice, an op row, a graph node or an expert to select it; the other views follow."));
    this.root.append(...shown);
  }

  private async card(kind: keyof Selection, id: unknown, path: () => string, body: (o: Obj) => [string, string | Node][]): Promise<HTMLElement | null> {
    if (id === null || id === undefined) return null;
    const label = Array.isArray(id) ? id.join("/") : String(id);
    const head = h("div", { class: "card-head" }, h("strong", {}, `${kind} ${label}`), h("button", { title: "clear", onclick: () => this.ctx.store.select({ [kind]: null } as Partial<Selection>) }, "×"));
    let rows: [string, string | Node][];
    try {
      rows = body(await getJson<Obj>(path()));
    } catch (e) {
      rows = [["error", e instanceof Error ? e.message : String(e)]];
    }
    return h("div", { class: "card", "data-card": kind, "data-id": label }, head, h("table", { class: "kv" }, ...rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", { "data-field": k }, v)))));
  }

  private link(text: string, f: () => void): HTMLElement {
    return h("a", { href: "#", onclick: (e: Event) => (e.preventDefault(), f()) }, text);
  }

  private ubatch(o: Obj): [string, string | Node][] {
    const u = num(o.index);
    const weights = arr(o.weights).reduce((a: number, w) => a + num(obj(w).bytes), 0);
    return [
      ["phase", String(o.phase)],
      ["tokens", arr(o.token_ids).join(", ")],
      ["ops", int(num(o.ops))],
      ["op seqs", arr(o.op_seq_range).join("–")],
      ["weights read", bytes(weights)],
      ["disk", bytes(num(o.disk_bytes))],
      ["faults maj/min", `${int(num(o.faults_major))} / ${int(num(o.faults_minor))}`],
      ["duration", ns(num(o.end_ns) - num(o.start_ns))],
      ["graph", this.link("show its graph", () => this.ctx.store.update((s) => void ((s.sel.ubatch = u), (s.tab = "graph"))))],
    ];
  }

  private op(o: Obj): [string, string | Node][] {
    const reads = arr(o.reads).map(obj);
    const weights = arr(o.weights).map(obj);
    const wbox = h("span", {});
    for (const w of weights) wbox.append(this.link(String(w.name), () => this.ctx.store.select({ tensor: num(w.tensor) })), " ");
    return [
      ["name", String(o.name)],
      ["ubatch", o.ubatch === null ? "–" : this.link(String(o.ubatch), () => this.ctx.store.select({ ubatch: num(o.ubatch) }))],
      ["layer", o.layer === null ? "–" : String(o.layer)],
      // A buffer names what non-file memory holds (KV cache, compute, repacked weights).
      ["output", `${o.dst} (${o.dst_buffer ? obj(o.dst_buffer).usage : o.dst_memory})`],
      ["sources", arr(o.srcs).map((n, i) => { const b = arr(o.src_buffers)[i]; return b ? `${n} (${obj(b).usage})` : String(n); }).join(", ")],
      ["weights", wbox],
      ["weight bytes", `${int(num(o.weight_bytes))} B`],
      ["reads", reads.map((r) => `${this.ctx.tensor(num(r.tensor))?.name ?? r.tensor} [${r.y0}, ${r.y1})${r.copy ? " copy" : ""}`).join("; ") || "–"],
      ["duration", o.dur_ns === null || o.dur_ns === undefined ? "untimed" : ns(num(o.dur_ns))],
    ];
  }

  private tensor(o: Obj): [string, string | Node][] {
    const usage = obj(o.usage);
    const id = num(o.tensor);
    const t = this.ctx.tensor(id);
    return [
      ["name", String(o.name)],
      ["type, shape", `${o.type} [${arr(o.shape).join(", ")}]`],
      ["size", `${bytes(num(o.size))} at ${t ? t.offset : "?"}`],
      ["ops reading it", int(num(o.ops))],
      ["ubatches", int(num(o.ubatches))],
      ["loaded / used", `${bytes(num(usage.loaded))} / ${bytes(num(usage.used))}`],
      ["loaded, never used", bytes(num(usage.loaded_unused))],
      ["read from disk", bytes(num(usage.disk_read))],
      [
        "memory map",
        this.link("zoom to its band", () =>
          this.ctx.store.update((s) => {
            if (!t) return;
            const pad = Math.max(16, Math.round(t.size * 0.02));
            s.mm.track = "disk";
            s.mm.y0 = Math.max(0, t.y0 - pad);
            s.mm.y1 = t.y0 + t.size + pad;
          }),
        ),
      ],
    ];
  }

  private layer(o: Obj): [string, string | Node][] {
    const usage = obj(o.usage);
    return [
      ["tensors", String(arr(o.tensors).length)],
      ["size", bytes(num(obj(o.stats).size_bytes))],
      ["bytes / token", bytes(num(obj(o.stats).bytes_per_token))],
      ["loaded / used", `${bytes(num(usage.loaded))} / ${bytes(num(usage.used))}`],
    ];
  }

  private expert(o: Obj): [string, string | Node][] {
    const usage = obj(o.usage);
    return [
      ["activations", arr(o.activations).map((a) => `${obj(a).phase} ${obj(a).tokens}`).join(", ")],
      ["slices", arr(o.slices).map((x) => String(obj(x).name)).join(", ")],
      ["disk read", bytes(num(usage.disk_read))],
      ["loaded / used", `${bytes(num(usage.loaded))} / ${bytes(num(usage.used))}`],
    ];
  }
}

function fields(o: Obj, keys: string[]): [string, string][] {
  return keys.filter((k) => k in o).map((k) => [k, o[k] === null ? "–" : String(o[k])]);
}



