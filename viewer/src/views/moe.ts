// MoE: the layer × expert activation grid over a phase or a ubatch range
// (`/api/v1/moe/grid`), and for one layer its activations over tokens,
// co-activation, stickiness and per-expert disk bytes. A click on an expert
// selects it; the memory map then lights its slices of the expert tensors.

import { getFrame, getJson, Latest } from "../api/client";
import type { Frame } from "../api/frame";
import type { MoeAnswer, MoeLayer } from "../api/types";
import { PHASES } from "../api/types";
import type { Ctx } from "../context";
import { logT, ramp, rgb } from "../ui/colors";
import { clear, clearError, fitCanvas, h, showError } from "../ui/dom";
import { bytes, int } from "../ui/format";

export class MoeView {
  private readonly phase = h("select", { id: "moe-phase" }, h("option", { value: "" }, "all phases"), ...PHASES.map((p) => h("option", { value: p }, p)));
  private readonly grid = h("canvas", { id: "moe-grid" });
  private readonly detail = h("div", { class: "moe-detail", id: "moe-detail" });
  private readonly latest = new Latest();
  private report: MoeAnswer | null = null;
  private counts: { layers: number[]; experts: number; cells: Map<number, number[]>; max: number } | null = null;
  private active = false;

  constructor(
    private readonly ctx: Ctx,
    private readonly root: HTMLElement,
  ) {
    this.phase.value = "generate";
    this.phase.addEventListener("change", () => void this.load());
    root.append(
      h("div", { class: "toolbar" }, h("strong", {}, "MoE"), h("label", {}, "activations in ", this.phase), h("span", { class: "hint" }, "click an expert: its slices light on the memory map")),
      h("div", { class: "moe-grid-box" }, this.grid),
      this.detail,
    );
    this.grid.addEventListener("click", (e) => this.onClick(e));
    new ResizeObserver(() => this.drawGrid()).observe(this.grid);
    ctx.store.subscribe((s, prev) => {
      if (!this.active) return;
      if (s.sel.expert?.join() !== prev.sel.expert?.join() || s.sel.layer !== prev.sel.layer) {
        this.drawGrid();
        void this.loadDetail();
      }
    });
  }

  activate(): void {
    if (this.active) return;
    this.active = true;
    void this.load();
  }

  private async load(): Promise<void> {
    if (!this.ctx.meta.moe.length) {
      clear(this.detail);
      this.detail.append(h("p", { id: "moe-none" }, "This trace's model has no MoE layers."));
      this.grid.hidden = true;
      return;
    }
    const phase = this.phase.value;
    await this.latest.run(
      () => Promise.all([getJson<MoeAnswer>("moe"), getFrame("moe/grid", { phase: phase || undefined })]),
      ([report, f]) => {
        clearError(this.root);
        this.report = report;
        this.counts = cells(f, this.ctx);
        this.grid.dataset.phase = phase || "all";
        this.grid.dataset.cells = JSON.stringify(Object.fromEntries([...this.counts.cells].map(([l, v]) => [l, v])));
        this.drawGrid();
        void this.loadDetail();
      },
      (e) => showError(this.root, e),
    );
  }

  private geometry() {
    const c = this.counts!;
    const w = this.grid.clientWidth;
    const left = 54;
    const top = 16;
    const cw = Math.max(4, Math.min(40, (w - left - 8) / c.experts));
    const ch = Math.max(8, Math.min(22, cw));
    return { left, top, cw, ch };
  }

  private drawGrid(): void {
    const c = this.counts;
    if (!c) return;
    const { left, top, cw, ch } = this.geometry();
    this.grid.style.height = `${top + c.layers.length * ch + 4}px`;
    this.grid.dataset.geometry = JSON.stringify({ left, top, cw, ch, layers: c.layers });
    const { ctx: g, w, h: hh } = fitCanvas(this.grid);
    g.fillStyle = "#0b0f17";
    g.fillRect(0, 0, w, hh);
    g.font = "10px system-ui, sans-serif";
    g.textBaseline = "middle";
    const sel = this.ctx.store.state.sel;
    for (let e = 0; e < c.experts; e++) {
      if (cw >= 14 || e % 5 === 0) {
        g.fillStyle = "#94a3b8";
        g.fillText(String(e), left + e * cw + 2, 8);
      }
    }
    c.layers.forEach((l, r) => {
      const y = top + r * ch;
      g.fillStyle = sel.layer === l ? "#22d3ee" : "#cbd5e1";
      g.fillText(`blk.${l}`, 4, y + ch / 2);
      const row = c.cells.get(l) ?? [];
      for (let e = 0; e < c.experts; e++) {
        const v = row[e] ?? 0;
        g.fillStyle = v > 0 ? rgb(ramp(0.1 + 0.9 * logT(v, c.max))) : "#161e2c";
        g.fillRect(left + e * cw, y, cw - 1, ch - 1);
        if (v > 0 && cw >= 18 && ch >= 12) {
          g.fillStyle = "#0b0f17";
          g.fillText(String(v), left + e * cw + 2, y + ch / 2);
        }
        if (sel.expert && sel.expert[0] === l && sel.expert[1] === e) {
          g.strokeStyle = "#ec4899";
          g.lineWidth = 2;
          g.strokeRect(left + e * cw + 1, y + 1, cw - 3, ch - 3);
        }
      }
    });
  }

  private onClick(e: MouseEvent): void {
    const c = this.counts;
    if (!c) return;
    const { left, top, cw, ch } = this.geometry();
    const r = Math.floor((e.offsetY - top) / ch);
    const x = Math.floor((e.offsetX - left) / cw);
    if (r < 0 || r >= c.layers.length) return;
    const layer = c.layers[r];
    if (x < 0 || x >= c.experts) this.ctx.store.select({ layer });
    else this.ctx.store.select({ expert: [layer, x], layer });
  }

  /** One layer: activations over tokens, co-activation, stickiness and per-expert disk bytes. */
  private async loadDetail(): Promise<void> {
    const sel = this.ctx.store.state.sel;
    const layer = sel.expert?.[0] ?? sel.layer ?? this.counts?.layers[0];
    const rep = this.report?.layers.find((l) => l.layer === layer);
    if (layer === undefined || !rep) return;
    const phase = this.phase.value;
    try {
      const [overTokens, co] = await Promise.all([
        getFrame<{ nx: number; x_bin: number; x_from: number }>("moe/tokens", { layer, w: 600 }),
        getFrame("moe/coactivation", { layer, phase: phase || undefined }),
      ]);
      this.renderDetail(rep, overTokens, co);
    } catch (e) {
      showError(this.root, e);
    }
  }

  private renderDetail(rep: MoeLayer, overTokens: Frame<{ nx: number; x_bin: number; x_from: number }>, co: Frame): void {
    clear(this.detail);
    const n = rep.n_expert;
    const sel = this.ctx.store.state.sel;
    this.detail.append(h("h4", {}, `blk.${rep.layer}: ${n} experts, top-${rep.k}`));
    const stick = h("p", { id: "moe-stickiness" }, "stickiness (share of a token's experts its predecessor also used): ");
    for (const ph of rep.phases) stick.append(h("span", { class: "chip", "data-phase": ph.phase }, `${ph.phase} ${ph.stickiness === null ? "–" : ph.stickiness.toFixed(3)}`));
    this.detail.append(stick);

    // Activations over tokens: expert rows × token buckets.
    const nx = overTokens.meta.nx;
    const over = h("canvas", { class: "moe-canvas", id: "moe-over-tokens" });
    over.style.height = `${Math.min(200, n * 8 + 4)}px`;
    this.detail.append(h("div", { class: "caption" }, `activations over routed tokens (bucket ${overTokens.meta.x_bin})`), over);
    requestAnimationFrame(() => {
      const { ctx: g, w, h: hh } = fitCanvas(over);
      g.fillStyle = "#0b0f17";
      g.fillRect(0, 0, w, hh);
      const ix = overTokens.col("ix");
      const ex = overTokens.col("expert");
      const tk = overTokens.col("tokens");
      let max = 0;
      for (let i = 0; i < overTokens.rows; i++) max = Math.max(max, tk[i]);
      for (let i = 0; i < overTokens.rows; i++) {
        g.fillStyle = rgb(ramp(0.15 + 0.85 * logT(tk[i], max)));
        g.fillRect((ix[i] / nx) * w, (ex[i] / n) * hh, Math.max(1, w / nx), Math.max(1, hh / n));
      }
      if (sel.expert && sel.expert[0] === rep.layer) {
        g.strokeStyle = "#ec4899";
        g.strokeRect(0, (sel.expert[1] / n) * hh, w, Math.max(1, hh / n));
      }
    });

    // Co-activation: a symmetric expert × expert matrix.
    const coC = h("canvas", { class: "moe-canvas square", id: "moe-coactivation" });
    const a = co.col("a");
    const b = co.col("b");
    const t = co.col("tokens");
    const pairs: [number, number, number][] = [];
    for (let i = 0; i < co.rows; i++) pairs.push([a[i], b[i], t[i]]);
    coC.dataset.pairs = JSON.stringify(pairs);
    this.detail.append(h("div", { class: "caption" }, "co-activation (tokens routed to both)"), coC);
    requestAnimationFrame(() => {
      const { ctx: g, w } = fitCanvas(coC);
      const cs = w / n;
      g.fillStyle = "#161e2c";
      g.fillRect(0, 0, w, w);
      const max = Math.max(1, ...pairs.map((p) => p[2]));
      for (const [x, y, v] of pairs) {
        g.fillStyle = rgb(ramp(0.15 + 0.85 * logT(v, max)));
        g.fillRect(x * cs, y * cs, cs - 0.5, cs - 0.5);
        g.fillRect(y * cs, x * cs, cs - 0.5, cs - 0.5);
      }
    });

    // Per-expert bytes: loaded, read from disk, used (the report's loaded vs used).
    const table = h("table", { class: "kv", id: "moe-experts" }, h("tr", {}, ...["expert", "activations", "disk read", "loaded", "used", "loaded unused"].map((x) => h("th", {}, x))));
    const acts = rep.phases.find((p) => p.phase === (this.phase.value || "generate"))?.activations ?? [];
    for (const ex of rep.experts) {
      table.append(
        h(
          "tr",
          {
            class: sel.expert?.[0] === rep.layer && sel.expert?.[1] === ex.expert ? "selected" : "",
            "data-expert": ex.expert,
            onclick: () => this.ctx.store.select({ expert: [rep.layer, ex.expert], layer: rep.layer }),
          },
          h("td", {}, String(ex.expert)),
          h("td", {}, int(acts[ex.expert] ?? 0)),
          h("td", { "data-field": "disk_read", "data-value": ex.disk_read }, bytes(ex.disk_read)),
          h("td", {}, bytes(ex.loaded)),
          h("td", {}, bytes(ex.used)),
          h("td", {}, bytes(ex.loaded_unused)),
        ),
      );
    }
    this.detail.append(h("div", { class: "caption" }, "per expert"), table);
  }
}

function cells(f: Frame, ctx: Ctx) {
  const layer = f.col("layer");
  const expert = f.col("expert");
  const tokens = f.col("tokens");
  const experts = Math.max(0, ...ctx.meta.moe.map((m) => m.n_expert));
  const layers = ctx.meta.moe.map((m) => m.layer).sort((a, b) => a - b);
  const map = new Map<number, number[]>(layers.map((l) => [l, new Array<number>(experts).fill(0)]));
  let max = 0;
  for (let i = 0; i < f.rows; i++) {
    const row = map.get(layer[i]);
    if (!row) continue;
    row[expert[i]] += tokens[i];
    max = Math.max(max, row[expert[i]]);
  }
  return { layers, experts, cells: map, max };
}
