// Memory: `ttrace simulate`'s miss-ratio curve — disk bytes per generated
// token at each memory budget, under LRU, Belady's OPT and the kernel-like
// two-list model. The server replays the trace in the background from the
// first request on (minutes on a long run) and keeps the answer; this view
// shows how far it got, then draws it.

import { pollJson } from "../api/client";
import type { SimPolicy, SimRow, SimulateAnswer } from "../api/types";
import { clear, fitCanvas, h, showError } from "../ui/dom";
import { bytes, int } from "../ui/format";

const COLORS: Record<SimPolicy, string> = { lru: "#22d3ee", opt: "#4ade80", "2q": "#f59e0b" };
const NAMES: Record<SimPolicy, string> = { lru: "LRU", opt: "OPT (floor)", "2q": "two-list (kernel-like)" };
const PAD = { left: 70, right: 34, top: 10, bottom: 34 };

export class SimulateView {
  private started = false;
  private answer: SimulateAnswer | null = null;
  private readonly canvas = h("canvas", { id: "simulate-plot" });

  constructor(private readonly root: HTMLElement) {
    root.dataset.view = "simulate";
    new ResizeObserver(() => this.draw()).observe(this.canvas);
  }

  activate(): void {
    if (this.started) return;
    this.started = true;
    clear(this.root);
    const bar = h("progress", { id: "simulate-progress", max: 1, value: 0 });
    const done = h("span", {}, "");
    this.root.append(h("div", { class: "loading", id: "simulate-loading" }, "simulating page-cache budgets on the server (a replay of the trace; minutes on a long run) ", bar, done));
    const shown = (fraction: number) => {
      bar.value = fraction;
      bar.dataset.progress = String(fraction);
      done.textContent = ` ${Math.round(fraction * 100)}%`;
    };
    pollJson<SimulateAnswer>("simulate", shown).then(
      (a) => this.render(a),
      (e) => {
        this.started = false;
        clear(this.root);
        showError(this.root, e);
      },
    );
  }

  private render(a: SimulateAnswer): void {
    this.answer = a;
    clear(this.root);
    const box = h("div", { id: "simulate" });
    const policies = policiesOf(a.rows);
    const budgets = [...new Set(a.rows.map((r) => r.budget_bytes))];
    box.append(
      h("h3", {}, "Memory budget → disk bytes per generated token"),
      h(
        "div",
        { class: "caption" },
        `${a.window ? `the first ${int(a.window.tokens)} of ${int(a.window.trace_tokens)} generated tokens replayed (\`ttrace simulate --tokens all\` replays every one)` : `${int(a.generated_tokens)} generated tokens`}; the ops read ${bytes(a.footprint_bytes)} of the model files; anonymous memory ${bytes(a.anon_bytes)} (${a.anon_source}); page ${bytes(a.page_bytes)}, readahead ${a.readahead ? `${bytes(a.readahead.window_bytes)} read-around for LRU and 2q (${a.readahead_source})` : "none"}, loading ${a.populate ? "replayed as MAP_POPULATE's read" : "not replayed"}.`,
      ),
      ...(a.fit_budget_bytes === null
        ? []
        : [h("div", { id: "simulate-fit", "data-bytes": a.fit_budget_bytes }, `Smallest budget at which generation reads nothing from disk (LRU, demand paging): ${bytes(a.fit_budget_bytes)}`)]),
      h("div", { class: "legend" }, ...policies.flatMap((p) => [h("span", { class: "swatch", style: `background:${COLORS[p]}` }), `${NAMES[p]} `])),
      h("div", { class: "simulate-plot-box" }, this.canvas),
      h(
        "div",
        { class: "table-box" },
        h(
          "table",
          { class: "grid", id: "simulate-table" },
          h("tr", {}, h("th", {}, "budget"), h("th", {}, "page cache"), ...policies.map((p) => h("th", {}, `${p} / token`))),
          ...budgets.map((b) => {
            const row = a.rows.filter((r) => r.budget_bytes === b);
            return h(
              "tr",
              {},
              h("td", {}, bytes(b)),
              h("td", {}, bytes(row[0].cache_bytes)),
              ...policies.map((p) => {
                const r = row.find((x) => x.policy === p);
                if (!r) return h("td", {}, "–");
                return h("td", { "data-budget": b, "data-policy": p, "data-misses": r.misses, "data-disk-bytes": r.disk_bytes }, r.disk_bytes_per_token === null ? "–" : bytes(r.disk_bytes_per_token));
              }),
            );
          }),
        ),
      ),
    );
    this.root.append(box);
    this.draw();
    box.dataset.loaded = "1";
  }

  /** The curves; the plotted points (CSS pixels, in drawing order) go in `data-points` for the tests. */
  private draw(): void {
    const a = this.answer;
    if (!a || !this.canvas.isConnected || this.canvas.clientWidth === 0) return;
    const { ctx, w, h: hgt } = fitCanvas(this.canvas);
    ctx.clearRect(0, 0, w, hgt);
    const xmax = Math.max(1, ...a.rows.map((r) => r.budget_bytes), a.fit_budget_bytes ?? 0);
    const ymax = Math.max(1, ...a.rows.map((r) => r.disk_bytes_per_token ?? 0));
    const x = (b: number) => PAD.left + (b / xmax) * (w - PAD.left - PAD.right);
    const y = (v: number) => hgt - PAD.bottom - (v / ymax) * (hgt - PAD.top - PAD.bottom);
    ctx.strokeStyle = "#475569";
    ctx.fillStyle = "#94a3b8";
    ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath();
    ctx.moveTo(PAD.left, PAD.top);
    ctx.lineTo(PAD.left, hgt - PAD.bottom);
    ctx.lineTo(w - PAD.right, hgt - PAD.bottom);
    ctx.stroke();
    for (let i = 0; i <= 4; i++) {
      ctx.textAlign = "center";
      ctx.fillText(bytes((xmax * i) / 4), x((xmax * i) / 4), hgt - PAD.bottom + 14);
      ctx.textAlign = "right";
      ctx.fillText(bytes((ymax * i) / 4), PAD.left - 4, y((ymax * i) / 4) + 4);
    }
    ctx.textAlign = "center";
    ctx.fillText("memory budget (cgroup limit)", PAD.left + (w - PAD.left - PAD.right) / 2, hgt - 4);
    if (a.fit_budget_bytes !== null) {
      ctx.setLineDash([4, 3]);
      ctx.beginPath();
      ctx.moveTo(x(a.fit_budget_bytes), PAD.top);
      ctx.lineTo(x(a.fit_budget_bytes), hgt - PAD.bottom);
      ctx.stroke();
      ctx.setLineDash([]);
    }
    const points: [SimPolicy, number, number][] = [];
    for (const r of a.rows) points.push([r.policy, Math.round(x(r.budget_bytes)), Math.round(y(r.disk_bytes_per_token ?? 0))]);
    ctx.lineWidth = 2;
    for (const p of policiesOf(a.rows)) {
      ctx.strokeStyle = COLORS[p];
      ctx.beginPath();
      points.filter((q) => q[0] === p).forEach(([, px, py], i) => (i ? ctx.lineTo(px, py) : ctx.moveTo(px, py)));
      ctx.stroke();
    }
    // Markers over every line: each point shows in its policy's colour
    // unless a later point sits on it.
    for (const [p, px, py] of points) {
      ctx.fillStyle = COLORS[p];
      ctx.fillRect(px - 2, py - 2, 5, 5);
    }
    ctx.lineWidth = 1;
    this.canvas.dataset.points = JSON.stringify(points);
  }
}

function policiesOf(rows: SimRow[]): SimPolicy[] {
  return [...new Set(rows.map((r) => r.policy))];
}
