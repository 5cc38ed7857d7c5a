// The graph of the selected ubatch (`/api/v1/graph`): its ops in execution
// order with producer → consumer edges. Layers start collapsed into one node
// each; a click opens one. Layouts come from a worker (dagre) and are cached
// by graph shape and open layers, so the many ubatches that share a shape
// are laid out once. A click on an op selects it and its first weight: the
// op table then lists that tensor's ops and the memory map outlines its band.

import { getJson, Latest } from "../api/client";
import type { GraphAnswer } from "../api/types";
import type { Ctx } from "../context";
import type { LayoutAnswer, LayoutRequest } from "../graph/protocol";
import { hue } from "../ui/colors";
import { capture, clear, clearError, h, showError } from "../ui/dom";

const SVG = "http://www.w3.org/2000/svg";
const NODE_H = 30;
/**
 * Producers read by more consumers than this (positions, masks, the
 * embeddings' output) are left out of the layout: their edges to every layer
 * would drag the chain into a staircase. They are drawn, faintly, after it.
 */
const HUB_FANOUT = 6;

interface DisplayNode {
  id: number;
  /** Graph node indexes it stands for (one, or a collapsed layer's). */
  members: number[];
  layer: number | null;
  collapsed: boolean;
  label: string;
  sub: string;
  w: number;
}

export class GraphView {
  private readonly svg = document.createElementNS(SVG, "svg");
  private readonly scene = document.createElementNS(SVG, "g");
  private readonly status = h("span", { class: "hint", id: "graph-status" });
  private readonly ubInput = h("input", { type: "number", id: "graph-ubatch", min: 0, class: "narrow" });
  private readonly worker = new Worker("assets/layout-worker.js", { type: "module" });
  private readonly layouts = new Map<string, Promise<LayoutAnswer>>();
  private readonly pending = new Map<string, (a: LayoutAnswer) => void>();
  private readonly latest = new Latest();
  private graph: GraphAnswer | null = null;
  private open = new Set<number>();
  private shown: { nodes: DisplayNode[]; layout: LayoutAnswer; hubEdges: [number, number][] } | null = null;
  private view = { x: 0, y: 0, k: 1 };
  private active = false;

  constructor(
    private readonly ctx: Ctx,
    private readonly root: HTMLElement,
  ) {
    this.svg.id = "graph";
    this.svg.append(this.scene);
    this.worker.onmessage = (e: MessageEvent<LayoutAnswer>) => this.pending.get(e.data.key)?.(e.data);
    this.ubInput.addEventListener("change", () => {
      const u = Number(this.ubInput.value);
      if (Number.isInteger(u) && u >= 0 && u < ctx.ub.n) ctx.store.select({ ubatch: u, token: ctx.ub.nTokens[u] ? ctx.ub.firstToken[u] : null });
    });
    const btn = (label: string, f: () => void) => h("button", { onclick: f }, label);
    root.append(
      h(
        "div",
        { class: "toolbar" },
        h("strong", {}, "Graph"),
        h("label", {}, "ubatch ", this.ubInput),
        btn("open all layers", () => this.setOpen(new Set(ctx.meta.layers))),
        btn("collapse layers", () => this.setOpen(new Set())),
        btn("fit", () => this.fit()),
        h("span", { class: "hint" }, "wheel: scroll · ctrl+wheel: zoom · drag: pan"),
        this.status,
      ),
      h("div", { class: "graph-box" }, this.svg),
    );
    this.bindPanZoom();
    ctx.store.subscribe((s, prev) => {
      if (!this.active) return;
      if (this.ubatch(s.sel.ubatch) !== this.ubatch(prev.sel.ubatch)) void this.load();
      else if (s.sel.layer !== prev.sel.layer && s.sel.layer !== null && !this.open.has(s.sel.layer)) this.setOpen(new Set([...this.open, s.sel.layer]));
      else this.paint();
    });
  }

  /** Called when the tab shows: the graph loads only when someone looks at it. */
  activate(): void {
    this.active = true;
    // Back on the tab with the same ubatch: keep the layout and where it was scrolled to.
    if (this.graph?.ubatch !== this.ubatch(this.ctx.store.state.sel.ubatch)) void this.load();
  }

  /** The selected ubatch, or the first generate one (else the first). */
  private ubatch(sel: number | null): number {
    if (sel !== null) return sel;
    for (let u = 0; u < this.ctx.ub.n; u++) if (this.ctx.phaseName(this.ctx.ub.phase[u]) === "generate") return u;
    return 0;
  }

  private async load(): Promise<void> {
    const u = this.ubatch(this.ctx.store.state.sel.ubatch);
    this.ubInput.value = String(u);
    this.status.textContent = "loading…";
    await this.latest.run(
      () => getJson<GraphAnswer>("graph", { ubatch: u }),
      (g) => {
        clearError(this.root);
        this.graph = g;
        this.svg.dataset.ubatch = String(g.ubatch);
        this.svg.dataset.nodes = String(g.nodes.length);
        this.svg.dataset.edges = String(g.edges.length);
        void this.relayout(true);
      },
      (e) => {
        this.status.textContent = "";
        showError(this.root, e);
      },
    );
  }

  private setOpen(open: Set<number>): void {
    this.open = open;
    void this.relayout(false);
  }

  private display(g: GraphAnswer): { nodes: DisplayNode[]; edges: [number, number][]; hubEdges: [number, number][] } {
    const nodes: DisplayNode[] = [];
    const byLayer = new Map<number, DisplayNode>();
    const layers = groupLayers(g);
    const of = g.nodes.map((n, i) => {
      const layer = layers[i];
      if (layer !== null && !this.open.has(layer)) {
        let d = byLayer.get(layer);
        if (!d) {
          d = { id: nodes.length, members: [], layer, collapsed: true, label: `blk.${layer}`, sub: "", w: 0 };
          byLayer.set(layer, d);
          nodes.push(d);
        }
        d.members.push(i);
        return d.id;
      }
      const dst = n.dst.length > 26 ? `${n.dst.slice(0, 25)}…` : n.dst;
      nodes.push({ id: nodes.length, members: [i], layer, collapsed: false, label: n.name, sub: dst, w: 0 });
      return nodes.length - 1;
    });
    for (const d of nodes) {
      if (d.collapsed) d.sub = `${d.members.length} ops (click to open)`;
      d.w = Math.max(d.label.length * 7, d.sub.length * 5.6) + 18;
    }
    const seen = new Set<string>();
    const all: [number, number][] = [];
    for (const [a, b] of g.edges) {
      const pa = of[a];
      const pb = of[b];
      if (pa === undefined || pb === undefined || pa === pb || seen.has(`${pa},${pb}`)) continue;
      seen.add(`${pa},${pb}`);
      all.push([pa, pb]);
    }
    const fanout = new Map<number, number>();
    for (const [a] of all) fanout.set(a, (fanout.get(a) ?? 0) + 1);
    const hub = (a: number) => (fanout.get(a) ?? 0) > HUB_FANOUT;
    for (const d of nodes) if (hub(d.id) && !d.collapsed) d.sub = `→ ${fanout.get(d.id)} consumers`;
    return { nodes, edges: all.filter(([a]) => !hub(a)), hubEdges: all.filter(([a]) => hub(a)) };
  }

  private layout(key: string, req: LayoutRequest): Promise<LayoutAnswer> {
    let p = this.layouts.get(key);
    if (!p) {
      p = new Promise((resolve) => this.pending.set(key, resolve));
      this.layouts.set(key, p);
      this.worker.postMessage(req);
    }
    return p;
  }

  private async relayout(fit: boolean): Promise<void> {
    const g = this.graph;
    if (!g) return;
    const d = this.display(g);
    const key = `${g.shape}|${[...this.open].sort((a, b) => a - b).join(",")}`;
    this.status.textContent = "laying out…";
    const t0 = performance.now();
    const lay = await this.layout(key, { key, nodes: d.nodes.map((n) => ({ id: n.id, w: n.w, h: NODE_H })), edges: d.edges });
    if (this.graph !== g) return;
    if (lay.error) return showError(this.root, new Error(`graph layout: ${lay.error}`));
    this.shown = { nodes: d.nodes, layout: lay, hubEdges: d.hubEdges };
    this.svg.dataset.drawn = String(d.nodes.length);
    this.status.textContent = `ubatch ${g.ubatch}: ${g.nodes.length} nodes, ${g.edges.length} edges (layout ${Math.round(performance.now() - t0)} ms)`;
    this.draw();
    if (fit) this.fit();
  }

  private draw(): void {
    const s = this.shown;
    const g = this.graph;
    if (!s || !g) return;
    clear(this.scene);
    const edgeLayer = document.createElementNS(SVG, "g");
    edgeLayer.setAttribute("class", "graph-edges");
    s.layout.edges.forEach((pts) => {
      if (pts.length < 2) return;
      const p = document.createElementNS(SVG, "polyline");
      p.setAttribute("points", pts.map((q) => `${q.x},${q.y}`).join(" "));
      edgeLayer.append(p);
    });
    for (const [a, b] of s.hubEdges) {
      const p = document.createElementNS(SVG, "line");
      const pa = s.layout.pos[a];
      const pb = s.layout.pos[b];
      p.setAttribute("x1", String(pa.x));
      p.setAttribute("y1", String(pa.y + NODE_H / 2));
      p.setAttribute("x2", String(pb.x));
      p.setAttribute("y2", String(pb.y - NODE_H / 2));
      p.setAttribute("class", "hub-edge");
      edgeLayer.append(p);
    }
    this.scene.append(edgeLayer);
    s.nodes.forEach((n, i) => {
      const { x, y } = s.layout.pos[i];
      const node = document.createElementNS(SVG, "g");
      node.setAttribute("class", `graph-node${n.collapsed ? " collapsed" : ""}`);
      node.setAttribute("transform", `translate(${x - n.w / 2},${y - NODE_H / 2})`);
      node.dataset.members = String(n.members.length);
      if (!n.collapsed) node.dataset.op = String(g.nodes[n.members[0]].op);
      if (n.layer !== null) node.dataset.layer = String(n.layer);
      const rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("width", String(n.w));
      rect.setAttribute("height", String(NODE_H));
      rect.setAttribute("rx", "4");
      rect.setAttribute("fill", n.collapsed ? "#1e293b" : hue(n.label));
      node.append(rect, text(n.label, 8, 12, "graph-label"), text(n.sub, 8, 24, "graph-sub"));
      node.addEventListener("click", (e) => {
        e.stopPropagation();
        this.onNode(n);
      });
      this.scene.append(node);
    });
    this.paint();
  }

  /** Selection marks, without a new layout. */
  private paint(): void {
    const g = this.graph;
    if (!g) return;
    const sel = this.ctx.store.state.sel;
    for (const el of this.scene.querySelectorAll<SVGGElement>(".graph-node")) {
      const op = el.dataset.op ? Number(el.dataset.op) : null;
      const node = op !== null ? g.nodes.find((n) => n.op === op) : undefined;
      el.classList.toggle("selected", op !== null && op === sel.op);
      el.classList.toggle("reads-tensor", !!node && sel.tensor !== null && node.weights.includes(sel.tensor));
      el.classList.toggle("in-layer", el.dataset.layer !== undefined && Number(el.dataset.layer) === sel.layer);
    }
  }

  private onNode(n: DisplayNode): void {
    if (n.collapsed && n.layer !== null) {
      this.ctx.store.select({ layer: n.layer });
      this.setOpen(new Set([...this.open, n.layer]));
      return;
    }
    const node = this.graph!.nodes[n.members[0]];
    this.ctx.store.select({ op: node.op, tensor: node.weights[0] ?? this.ctx.store.state.sel.tensor });
  }

  private fit(): void {
    const s = this.shown;
    const box = this.svg.getBoundingClientRect();
    if (!s || !box.width) return;
    // Graphs are deep chains: fit the width, start at the top, scroll down.
    const k = Math.max(0.25, Math.min(box.width / Math.max(1, s.layout.width), 1.2));
    this.view = { k, x: Math.max(0, (box.width - s.layout.width * k) / 2), y: 6 };
    this.applyView();
  }

  private applyView(): void {
    this.scene.setAttribute("transform", `translate(${this.view.x},${this.view.y}) scale(${this.view.k})`);
  }

  private bindPanZoom(): void {
    const svg = this.svg;
    svg.addEventListener(
      "wheel",
      (e) => {
        e.preventDefault();
        if (!e.ctrlKey && !e.shiftKey) {
          // A deep chain reads like a page: the wheel scrolls it.
          this.view = { ...this.view, x: this.view.x - e.deltaX, y: this.view.y - e.deltaY };
          return this.applyView();
        }
        const f = Math.exp(-Math.max(-1, Math.min(1, (e.deltaY || e.deltaX) * 0.0015)));
        const r = svg.getBoundingClientRect();
        const px = e.clientX - r.left;
        const py = e.clientY - r.top;
        const v = this.view;
        const k = Math.min(8, Math.max(0.02, v.k * f));
        this.view = { k, x: px - ((px - v.x) * k) / v.k, y: py - ((py - v.y) * k) / v.k };
        this.applyView();
      },
      { passive: false },
    );
    let drag: { x: number; y: number; vx: number; vy: number } | null = null;
    svg.addEventListener("pointerdown", (e) => {
      if ((e.target as Element).closest(".graph-node")) return;
      drag = { x: e.clientX, y: e.clientY, vx: this.view.x, vy: this.view.y };
      capture(svg, e);
    });
    svg.addEventListener("pointermove", (e) => {
      if (!drag) return;
      this.view = { ...this.view, x: drag.vx + e.clientX - drag.x, y: drag.vy + e.clientY - drag.y };
      this.applyView();
    });
    svg.addEventListener("pointerup", () => (drag = null));
  }
}

/**
 * The layer each node collapses into: its own, or for an op without one
 * (a KV-cache write, the attention itself, a shared norm) the layer of the
 * ops on both sides of it in execution order, when they agree. Ops before
 * the first layer and after the last stay on their own.
 */
function groupLayers(g: GraphAnswer): (number | null)[] {
  const n = g.nodes.length;
  const before: (number | null)[] = new Array(n).fill(null);
  const after: (number | null)[] = new Array(n).fill(null);
  let last: number | null = null;
  for (let i = 0; i < n; i++) {
    if (g.nodes[i].layer !== null) last = g.nodes[i].layer;
    before[i] = last;
  }
  last = null;
  for (let i = n - 1; i >= 0; i--) {
    if (g.nodes[i].layer !== null) last = g.nodes[i].layer;
    after[i] = last;
  }
  return g.nodes.map((node, i) => node.layer ?? (before[i] !== null && before[i] === after[i] ? before[i] : null));
}

function text(s: string, x: number, y: number, cls: string): SVGTextElement {
  const t = document.createElementNS(SVG, "text");
  t.setAttribute("x", String(x));
  t.setAttribute("y", String(y));
  t.setAttribute("class", cls);
  t.textContent = s;
  return t;
}
