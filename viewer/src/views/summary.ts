// Summary: the figures of `ttrace report --json` (the server answers the
// very document), as tables: run, tokens, phases, per generated token,
// layers, components, loaded vs used, hottest tensors, MoE, lost events.
// The whole document stays one click away, as it came.

import { getJson } from "../api/client";
import type { Ctx } from "../context";
import { clear, h, showError } from "../ui/dom";
import { bytes, int, ns } from "../ui/format";
import { arr, num as numOf, type Obj, obj, objs } from "../ui/json";

const MAX_ROWS = 2000;


export class SummaryView {
  private loaded = false;

  constructor(
    private readonly ctx: Ctx,
    private readonly root: HTMLElement,
  ) {
    root.dataset.view = "summary";
  }

  activate(): void {
    if (this.loaded) return;
    this.loaded = true;
    getJson<Obj>("summary").then(
      (r) => this.render(r),
      (e) => {
        this.loaded = false;
        showError(this.root, e);
      },
    );
  }

  private render(r: Obj): void {
    const root = h("div", { id: "summary" });
    clear(this.root);
    this.root.append(root);
    const s = obj(r.summary);
    const stats = obj(r.stats);
    const tokens = obj(r.tokens);
    root.append(
      h("h3", {}, "Run"),
      kv([
        ["command", arr(s.command).join(" "), null],
        ["mode", String(s.mode ?? ""), null],
        ["duration", ns(numOf(s.duration_ns)), numOf(s.duration_ns)],
        ["ops", int(numOf(r.ops)), numOf(r.ops)],
        ["faults", int(numOf(r.faults)), numOf(r.faults)],
        ["distinct weights", int(numOf(s.distinct_weights)), numOf(s.distinct_weights)],
        ["weight bytes per token", bytes(numOf(s.weight_bytes_per_token)), numOf(s.weight_bytes_per_token)],
        ["prompt tokens", int(numOf(tokens.prompt)), numOf(tokens.prompt)],
        ["generated tokens", int(numOf(tokens.generated)), numOf(tokens.generated)],
        ["sequences", int(numOf(tokens.sequences)), numOf(tokens.sequences)],
        ["tracepoints", String(s.tracepoints ?? ""), null],
      ]),
      h("h3", {}, "Lost events"),
      kv(Object.entries(obj(r.lost)).map(([k, v]) => [k, int(numOf(v)), numOf(v)])),
      h("h3", {}, "Phases"),
      table(objs(stats.phases), [
        ["phase", (x) => String(x.phase)],
        ["ubatches", (x) => int(numOf(x.ubatches))],
        ["tokens", (x) => int(numOf(x.tokens))],
        ["duration", (x) => ns(numOf(x.duration_ns))],
        ["ops", (x) => int(numOf(x.ops))],
        ["weight bytes", (x) => bytes(numOf(x.weight_bytes))],
        ["faults", (x) => int(numOf(x.faults))],
        ["disk", (x) => bytes(numOf(x.disk_bytes))],
      ]),
      h("h3", {}, "Per ubatch"),
      table(
        // A long run has tens of thousands: the table shows the first ones (the timeline has them all).
        objs(stats.ubatches).slice(0, MAX_ROWS),
        [
          ["ubatch", (x) => String(x.index)],
          ["phase", (x) => String(x.phase)],
          ["token", (x) => (x.token_index === null ? "" : String(x.token_index))],
          ["token ids", (x) => arr(x.token_ids).slice(0, 8).join(", ")],
          ["ops", (x) => int(numOf(x.ops))],
          ["weight bytes", (x) => bytes(numOf(x.weight_bytes))],
          ["disk", (x) => bytes(numOf(x.disk_bytes))],
          ["faults maj/min", (x) => `${int(numOf(x.faults_major))} / ${int(numOf(x.faults_minor))}`],
          ["duration", (x) => ns(numOf(x.duration_ns))],
        ],
        (x) => this.ctx.store.select({ ubatch: numOf(x.index) }),
      ),
      h("h3", {}, "Layers"),
      table(objs(stats.layers), groupColumns("layer")),
      h("h3", {}, "Components"),
      table(objs(stats.components), groupColumns("component")),
    );
    const lvu = obj(stats.loaded_vs_used);
    if (lvu.total) {
      const t = obj(lvu.total);
      root.append(
        h("h3", {}, "Loaded vs used"),
        kv(["size_bytes", "loaded", "disk", "used", "loaded_unused", "disk_unused", "disk_read"].map((k) => [k.replace("_", " "), bytes(numOf(t[k])), numOf(t[k])])),
      );
    }
    const hot = [...objs(stats.tensors)].sort((a, b) => numOf(b.tokens_touched) - numOf(a.tokens_touched) || numOf(b.size_bytes) - numOf(a.size_bytes));
    root.append(
      h("h3", {}, "Tensors (most tokens first)"),
      table(
        hot.slice(0, 300),
        [
          ["tensor", (x) => String(x.name)],
          ["size", (x) => bytes(numOf(x.size_bytes))],
          ["tokens", (x) => int(numOf(x.tokens_touched))],
          ["ubatches", (x) => int(numOf(x.ubatches_touched))],
          ["file / copy accesses", (x) => `${int(numOf(x.file_backed_accesses))} / ${int(numOf(x.copy_accesses))}`],
          ["faults", (x) => int(numOf(x.faults))],
          ["disk", (x) => (x.disk_bytes === null ? "–" : bytes(numOf(x.disk_bytes)))],
        ],
        (x) => this.ctx.store.select({ tensor: numOf(x.tensor) }),
      ),
    );
    const moe = obj(stats.moe);
    if (arr(moe.layers).length) {
      root.append(
        h("h3", {}, "MoE"),
        table(objs(moe.layers), [
          ["layer", (x) => String(x.layer)],
          ["experts", (x) => `${x.n_expert} (top-${x.k})`],
          ["stickiness", (x) => arr(x.phases).map((p) => `${obj(p).phase} ${obj(p).stickiness === null ? "–" : numOf(obj(p).stickiness).toFixed(3)}`).join(", ")],
        ]),
      );
    }
    const notes = [...arr(stats.notes), ...arr(lvu.notes)].map(String);
    if (notes.length) root.append(h("h3", {}, "Notes"), h("ul", {}, ...notes.map((n) => h("li", {}, n))));
    // The document can be tens of MB: written out only when opened.
    const pre = h("pre", { id: "summary-json" });
    const whole = h("details", {}, h("summary", {}, "the whole report (ttrace report --json)"), pre);
    whole.addEventListener("toggle", () => {
      if (whole.open && !pre.textContent) pre.textContent = JSON.stringify(r, null, 1);
    });
    root.append(whole);
    root.dataset.loaded = "1";
  }
}




/** The report's per-layer and per-component rows share one shape. */
function groupColumns(key: string): [string, (x: Obj) => string][] {
  return [
    [key, (x) => String(x.key)],
    ["tensors", (x) => int(numOf(x.tensors))],
    ["size", (x) => bytes(numOf(x.size_bytes))],
    ["bytes / token", (x) => bytes(numOf(x.bytes_per_token))],
  ];
}

function kv(rows: [string, string, number | null][]): HTMLElement {
  return h(
    "table",
    { class: "kv" },
    ...rows.map(([k, shown, raw]) => h("tr", {}, h("th", {}, k), h("td", { "data-figure": k, "data-value": raw === null ? undefined : raw }, shown))),
  );
}

function table(rows: Obj[], cols: [string, (x: Obj) => string][], onRow?: (x: Obj) => void): HTMLElement {
  return h(
    "div",
    { class: "table-box" },
    h(
      "table",
      { class: "grid" },
      h("tr", {}, ...cols.map(([c]) => h("th", {}, c))),
      ...rows.map((x) => h("tr", { class: onRow ? "clickable" : "", onclick: onRow ? () => onRow(x) : undefined }, ...cols.map(([, f]) => h("td", {}, f(x))))),
    ),
  );
}
