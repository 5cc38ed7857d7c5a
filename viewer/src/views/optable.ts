// The op table: every op of the trace, filtered and sorted by the server
// (`/api/v1/ops`), drawn as a virtual list: only the visible rows exist in
// the DOM, fetched in pages. Past a few hundred thousand rows the scrollbar
// maps proportionally onto the rows, so ten million rows scroll too.

import { getFrame, type Params } from "../api/client";
import type { Frame } from "../api/frame";
import { NONE_U32 } from "../api/frame";
import { MEMORY, PHASES } from "../api/types";
import type { Ctx } from "../context";
import { changed, type OpSort, type State } from "../state";
import { clear, clearError, h, showError } from "../ui/dom";
import { int, ns } from "../ui/format";

const ROW_H = 20;
const PAGE = 500;
const MAX_SCROLL_PX = 8_000_000;
/** Pages kept while scrolling through millions of rows: the ones nearest the view. */
const KEEP_PAGES = 64;

interface OpsMeta {
  total: number;
  offset: number;
  strings: string[];
}

const COLUMNS: { key: string; label: string; sort?: OpSort; width: string }[] = [
  { key: "op", label: "op", sort: "op_seq", width: "64px" },
  { key: "ubatch", label: "ubatch", sort: "ubatch", width: "52px" },
  { key: "gen", label: "token", width: "40px" },
  { key: "name", label: "op name", width: "104px" },
  { key: "layer", label: "layer", sort: "layer", width: "44px" },
  { key: "dst", label: "output", width: "minmax(140px, 1fr)" },
  { key: "srcs", label: "sources", width: "minmax(220px, 1.6fr)" },
  { key: "memory", label: "output memory", width: "90px" },
  { key: "weight_bytes", label: "weight bytes", sort: "weight_bytes", width: "92px" },
  { key: "dur", label: "duration", sort: "dur", width: "72px" },
];

export class OpTable {
  private readonly total = h("span", { id: "op-total", "data-total": "" });
  private readonly chips = h("span", { class: "chips", id: "op-chips" });
  private readonly scroller = h("div", { class: "ops-scroll", id: "op-scroll" });
  private readonly spacer = h("div", { class: "ops-spacer" });
  private readonly rowsEl = h("div", { class: "ops-rows", id: "op-rows" });
  private readonly header = h("div", { class: "ops-row ops-head" });
  private pages = new Map<number, Promise<Frame<OpsMeta>> | Frame<OpsMeta>>();
  private count = 0;
  private generation = 0;

  constructor(
    private readonly ctx: Ctx,
    private readonly root: HTMLElement,
  ) {
    const grid = COLUMNS.map((c) => c.width).join(" ");
    root.style.setProperty("--op-cols", grid);
    // The header scrolls sideways with the rows (sticky on top).
    this.scroller.append(this.header, this.spacer, this.rowsEl);
    root.append(this.filterBar(), h("div", { class: "ops-status" }, this.total, this.chips), this.scroller);
    this.scroller.addEventListener("scroll", () => this.render());
    new ResizeObserver(() => this.render()).observe(this.scroller);
    ctx.store.subscribe((s, prev) => {
      if (changed(s.ops, prev.ops) || (s.ops.linked && changed(linkedSel(s), linkedSel(prev)))) this.reload();
      else if (s.sel.op !== prev.sel.op) this.render();
    });
    this.renderHeader();
    this.reload();
  }

  private params(): Params {
    const s = this.ctx.store.state;
    const o = s.ops;
    const sel = s.sel;
    const linked = o.linked;
    const ubatch = linked && sel.ubatch !== null && o.fromUbatch === null && o.toUbatch === null ? sel.ubatch : null;
    return {
      op: o.op,
      name: o.name || undefined,
      // Enumerations travel as their names.
      phase: o.phase.map((p) => PHASES[p]),
      memory: o.memory.map((m) => MEMORY[m]),
      from_ubatch: ubatch ?? o.fromUbatch ?? undefined,
      to_ubatch: ubatch !== null ? ubatch + 1 : (o.toUbatch ?? undefined),
      tensor: linked ? (sel.tensor ?? undefined) : undefined,
      // The table's own layer and sequence filters win over the selection's.
      layer: o.layer.length ? o.layer : linked ? (sel.layer ?? undefined) : undefined,
      seq: o.seq.length ? o.seq : linked ? (sel.seq ?? undefined) : undefined,
      sort: o.sort === "op_seq" ? undefined : o.sort,
      desc: o.desc ? 1 : undefined,
    };
  }

  private reload(): void {
    this.pages = new Map();
    this.generation++;
    this.scroller.scrollTop = 0;
    this.renderChips();
    this.renderHeader();
    this.total.dataset.total = "";
    this.total.textContent = "…";
    void this.page(0).then(
      (f) => this.setTotal(f.meta.total),
      (e) => this.fail(e),
    );
  }

  private fail(e: unknown): void {
    this.total.textContent = "error";
    showError(this.root, e);
  }

  private setTotal(n: number): void {
    clearError(this.root);
    this.count = n;
    this.total.dataset.total = String(n);
    this.total.textContent = `${int(n)} ops`;
    this.spacer.style.height = `${Math.min(MAX_SCROLL_PX, n * ROW_H)}px`;
    this.render();
  }

  private page(offset: number): Promise<Frame<OpsMeta>> {
    const have = this.pages.get(offset);
    if (have) return Promise.resolve(have);
    const gen = this.generation;
    const p = getFrame<OpsMeta>("ops", { ...this.params(), offset, limit: PAGE });
    this.pages.set(offset, p);
    if (this.pages.size > KEEP_PAGES) {
      const far = [...this.pages.keys()].sort((a, b) => Math.abs(b - offset) - Math.abs(a - offset));
      for (const k of far.slice(0, this.pages.size - KEEP_PAGES)) this.pages.delete(k);
    }
    void p.then(
      (f) => {
        if (gen !== this.generation) return;
        this.pages.set(offset, f);
        this.render();
      },
      (e) => gen === this.generation && this.fail(e),
    );
    return p;
  }

  /** First visible row: exact while the list fits the scroll range, proportional past it. */
  private firstRow(visible: number): number {
    const top = this.scroller.scrollTop;
    if (this.count * ROW_H <= MAX_SCROLL_PX) return Math.floor(top / ROW_H);
    const range = Math.max(1, MAX_SCROLL_PX + ROW_H - this.scroller.clientHeight);
    return Math.round((top / range) * Math.max(0, this.count - visible));
  }

  private render(): void {
    const visible = Math.ceil((this.scroller.clientHeight - ROW_H) / ROW_H) + 1;
    const first = Math.min(this.firstRow(visible), Math.max(0, this.count - 1));
    const last = Math.min(this.count, first + visible);
    clear(this.rowsEl);
    this.rowsEl.style.transform = `translateY(${this.scroller.scrollTop - (this.count * ROW_H <= MAX_SCROLL_PX ? this.scroller.scrollTop % ROW_H : 0)}px)`;
    this.rowsEl.dataset.first = String(first);
    const selOp = this.ctx.store.state.sel.op;
    for (let i = first; i < last; i++) {
      const off = Math.floor(i / PAGE) * PAGE;
      const f = this.pages.get(off);
      if (!f || f instanceof Promise) {
        if (!f) void this.page(off);
        this.rowsEl.append(h("div", { class: "ops-row loading" }, "…"));
        continue;
      }
      this.rowsEl.append(this.row(f, i - off, selOp));
    }
  }

  private row(f: Frame<OpsMeta>, r: number, selOp: number | null): HTMLElement {
    const c = (n: string) => f.col(n);
    const op = c("op")[r];
    const strings = f.meta.strings;
    const layer = c("layer")[r];
    const gen = c("gen")[r];
    const wb = c("weight_bytes")[r];
    const dur = c("dur_ns")[r];
    const wt = c("weight_tensor")[r];
    const cells = [
      String(op),
      String(c("ubatch")[r] === NONE_U32 ? "–" : c("ubatch")[r]),
      gen === NONE_U32 ? "" : String(gen),
      this.ctx.opName(c("name")[r]),
      layer === NONE_U32 ? "" : String(layer),
      strings[c("dst")[r]] ?? "",
      strings[c("srcs")[r]] ?? "",
      MEMORY[c("memory")[r]] ?? "",
      wb ? int(wb) : "",
      Number.isNaN(dur) ? "" : ns(dur),
    ];
    return h(
      "div",
      {
        class: `ops-row${op === selOp ? " selected" : ""}`,
        "data-op": op,
        title: wt !== NONE_U32 ? `weight: ${this.ctx.tensor(wt)?.name ?? wt}` : "",
        // Only the op: selecting its ubatch too would re-filter this very table.
        onclick: () => this.ctx.store.select({ op }),
      },
      ...cells.map((t) => h("span", {}, t)),
    );
  }

  private renderHeader(): void {
    clear(this.header);
    const o = this.ctx.store.state.ops;
    for (const col of COLUMNS) {
      const sorted = col.sort && o.sort === col.sort;
      this.header.append(
        h(
          "span",
          {
            class: col.sort ? "sortable" : "",
            "data-sort": col.sort,
            onclick: col.sort
              ? () => this.ctx.store.update((s) => {
                  if (s.ops.sort === col.sort) s.ops.desc = !s.ops.desc;
                  else [s.ops.sort, s.ops.desc] = [col.sort!, col.sort !== "op_seq"];
                })
              : undefined,
          },
          col.label + (sorted ? (o.desc ? " ▼" : " ▲") : ""),
        ),
      );
    }
  }

  /** The selection parts that filter the table, each removable. */
  private renderChips(): void {
    clear(this.chips);
    const s = this.ctx.store.state;
    if (!s.ops.linked) return;
    const sel = s.sel;
    const chip = (label: string, clearSel: () => void, key: string) =>
      this.chips.append(h("span", { class: "chip", "data-chip": key }, label, h("button", { title: "clear", onclick: clearSel }, "×")));
    if (sel.tensor !== null) chip(`tensor ${this.ctx.tensor(sel.tensor)?.name ?? sel.tensor}`, () => this.ctx.store.select({ tensor: null }), "tensor");
    if (sel.layer !== null && !s.ops.layer.length) chip(`layer ${sel.layer}`, () => this.ctx.store.select({ layer: null }), "layer");
    if (sel.ubatch !== null && s.ops.fromUbatch === null && s.ops.toUbatch === null)
      chip(`ubatch ${sel.ubatch}`, () => this.ctx.store.select({ ubatch: null, token: null }), "ubatch");
    if (sel.seq !== null && !s.ops.seq.length) chip(`sequence ${sel.seq}`, () => this.ctx.store.select({ seq: null }), "seq");
  }

  private filterBar(): HTMLElement {
    const store = this.ctx.store;
    const sync: ((s: State) => void)[] = [];
    // One value or none; `values` are the ids when they are not the indexes of `names`.
    const multi = (id: string, names: readonly string[], get: (s: State) => number[], set: (s: State, v: number[]) => void, all: string, values?: readonly number[]) => {
      const el = h("select", { id, onchange: () => store.update((s) => set(s, el.value === "" ? [] : [Number(el.value)])) }, h("option", { value: "" }, all), ...names.map((n, i) => h("option", { value: values ? values[i] : i }, n)));
      sync.push((s) => (el.value = get(s).length === 1 ? String(get(s)[0]) : ""));
      return el;
    };
    const numInput = (id: string, placeholder: string, get: (s: State) => number | null, set: (s: State, v: number | null) => void) => {
      const el = h("input", { id, type: "number", min: 0, placeholder, class: "narrow", onchange: () => store.update((s) => set(s, el.value === "" ? null : Number(el.value))) });
      sync.push((s) => (el.value = get(s) === null ? "" : String(get(s))));
      return el;
    };
    let nameTimer = 0;
    const name = h("input", {
      id: "op-filter-name",
      type: "search",
      placeholder: "tensor name regex",
      oninput: () => {
        clearTimeout(nameTimer);
        nameTimer = window.setTimeout(() => store.update((s) => void (s.ops.name = name.value)), 300);
      },
    });
    sync.push((s) => {
      if (document.activeElement !== name) name.value = s.ops.name;
    });
    const linked = h("input", { type: "checkbox", id: "op-linked", onchange: () => store.update((s) => void (s.ops.linked = linked.checked)) });
    sync.push((s) => (linked.checked = s.ops.linked));
    const bar = h(
      "div",
      { class: "toolbar", id: "op-filters" },
      multi("op-filter-op", this.ctx.meta.op_names, (s) => s.ops.op, (s, v) => void (s.ops.op = v), "all ops"),
      name,
      multi("op-filter-layer", this.ctx.meta.layers.map((l) => `layer ${l}`), (s) => s.ops.layer, (s, v) => void (s.ops.layer = v), "all layers", this.ctx.meta.layers),
      multi("op-filter-phase", PHASES, (s) => s.ops.phase, (s, v) => void (s.ops.phase = v), "all phases"),
      multi("op-filter-memory", MEMORY, (s) => s.ops.memory, (s, v) => void (s.ops.memory = v), "any memory"),
      multi("op-filter-seq", this.ctx.meta.sequences.map((q) => `sequence ${q}`), (s) => s.ops.seq, (s, v) => void (s.ops.seq = v), "all sequences", this.ctx.meta.sequences),
      numInput("op-filter-from", "from ubatch", (s) => s.ops.fromUbatch, (s, v) => void (s.ops.fromUbatch = v)),
      numInput("op-filter-to", "to ubatch", (s) => s.ops.toUbatch, (s, v) => void (s.ops.toUbatch = v)),
      h("label", { class: "toggle", title: "the selected tensor, layer, ubatch and sequence filter the table" }, linked, "follow selection"),
    );
    const apply = (s: State) => sync.forEach((f) => f(s));
    apply(store.state);
    store.subscribe(apply);
    return bar;
  }
}

function linkedSel(s: State) {
  return [s.sel.tensor, s.sel.layer, s.sel.ubatch, s.sel.seq];
}
