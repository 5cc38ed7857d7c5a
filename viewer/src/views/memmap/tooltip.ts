// The hover tooltip of the memory map: the exact figures of the cell under
// the cursor (`memmap/cell`), per tensor in it, and a magnifier that shows
// the bands around the cursor enlarged when they are drawn a few pixels
// tall. Fields carry data-field / data-value so tests read exact numbers.

import { getJson, Latest } from "../../api/client";
import type { Band, CellTensor } from "../../api/types";
import type { Ctx } from "../../context";
import { hue, logT, ramp, rgb } from "../../ui/colors";
import { clear, h } from "../../ui/dom";
import { bytes, hex, int } from "../../ui/format";
import { cellParams, type TensorMatrix } from "./data";
import type { Box, Scene } from "./draw";

const MAGNIFY_BELOW_PX = 8;
const MAGNIFIED_ROWS = 5;

export class CellTooltip {
  readonly el = h("div", { id: "memmap-tooltip", class: "tooltip", hidden: true });
  private readonly latest = new Latest();
  private timer = 0;
  private key = "";

  constructor(
    private readonly ctx: Ctx,
    parent: HTMLElement,
  ) {
    parent.append(this.el);
  }

  hide(): void {
    clearTimeout(this.timer);
    this.key = "";
    this.el.hidden = true;
  }

  show(box: Box, band: Band | null, px: number, py: number, sc: Scene, tensors: TensorMatrix | null): void {
    this.place(px, py, sc);
    const key = JSON.stringify(box);
    if (key === this.key && !this.el.hidden) return;
    this.key = key;
    clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.load(box, band, sc, tensors), 60);
  }

  private place(px: number, py: number, sc: Scene): void {
    const right = px + 16 + 380 > sc.plot.l + sc.plot.w + 60;
    this.el.style.left = right ? "" : `${px + 16}px`;
    this.el.style.right = right ? `${sc.plot.l + sc.plot.w + 64 - px + 16}px` : "";
    this.el.style.top = `${Math.max(0, Math.min(py + 12, sc.plot.t + sc.plot.h - 220))}px`;
  }

  private async load(box: Box, band: Band | null, sc: Scene, tensors: TensorMatrix | null): Promise<void> {
    const params = cellParams(this.ctx.store.state.mm, box);
    await this.latest.run(
      () => getJson<{ tensors: CellTensor[] }>("memmap/cell", params),
      (cell) => this.render(box, band, cell.tensors, sc, tensors),
      (e) => this.render(box, band, [], sc, tensors, e instanceof Error ? e.message : String(e)),
    );
  }

  private render(box: Box, band: Band | null, cell: CellTensor[], sc: Scene, tensors: TensorMatrix | null, error?: string): void {
    const el = this.el;
    clear(el);
    for (const [k, v] of Object.entries(box)) el.dataset[k] = String(v);
    el.append(h("div", { class: "tt-head" }, this.xLabel(box), " · ", `${hex(box.y0)}–${hex(box.y1)} (${bytes(box.y1 - box.y0)})`));
    if (error) el.append(h("div", { class: "tt-error" }, error));
    if (!cell.length) el.append(h("div", { class: "tt-none", "data-field": "empty" }, band ? `${band.name}: nothing read here` : "no tensor here"));
    for (const t of cell.slice(0, 6)) el.append(tensorBlock(t));
    if (cell.length > 6) el.append(h("div", { class: "tt-more" }, `… and ${cell.length - 6} more tensors`));
    const seg = band ? sc.ylay.segs.find((s) => s.band >= 0 && sc.bands[s.band] === band) : undefined;
    if (seg && seg.px1 - seg.px0 < MAGNIFY_BELOW_PX) el.append(magnifier(sc, sc.ylay.segs.indexOf(seg), tensors));
    el.hidden = false;
  }

  private xLabel(box: Box): string {
    const ub = this.ctx.ub;
    if (this.ctx.store.state.mm.x === "time") return `t ${(box.x0 / 1e9).toFixed(4)}–${(box.x1 / 1e9).toFixed(4)} s`;
    if (box.x1 - box.x0 === 1 && box.x0 < ub.n) {
      const u = box.x0;
      const phase = this.ctx.phaseName(ub.phase[u]);
      const gen = ub.gen[u] !== 0xffffffff ? `, token ${ub.gen[u]}` : "";
      return `ubatch ${u} (${phase}${gen})`;
    }
    return `ubatches ${box.x0}–${box.x1 - 1}`;
  }
}

function field(name: string, label: string, value: number | string, shown?: string): HTMLElement {
  return h(
    "div",
    { class: "tt-field" },
    h("span", { class: "tt-label" }, label),
    h("span", { "data-field": name, "data-value": String(value) }, shown ?? String(value)),
  );
}

function tensorBlock(t: CellTensor): HTMLElement {
  const tokens = t.tokens ?? [];
  const sample = t.ops ?? [];
  return h(
    "div",
    { class: "tt-tensor", "data-tensor": t.tensor },
    h("div", { class: "tt-name", "data-field": "name", "data-value": t.name }, t.name),
    field("range", "bytes", `${t.y0}-${t.y1}`, `${hex(t.y0)}–${hex(t.y1)} (${bytes(t.y1 - t.y0)})`),
    field("read_bytes", "read in this cell", t.read_bytes, `${int(t.read_bytes)} B`),
    field("report_bytes", "read in these ubatches (report)", t.report_bytes, `${int(t.report_bytes)} B`),
    field("ops", "ops", t.op_count, `${int(t.op_count)}${sample.length ? ` (${sample.slice(0, 4).join(", ")}${sample.length > 4 ? ", …" : ""})` : ""}`),
    field("ubatches", "ubatches", t.ubatches),
    field("tokens", "token ids", tokens.join(","), tokens.length > 12 ? `${tokens.slice(0, 12).join(", ")}, … (${tokens.length})` : tokens.join(", ") || "–"),
    field("disk_bytes", "disk reads", t.disk_bytes, `${int(t.disk_bytes)} B`),
    field("faults_major", "major faults", t.faults_major),
    field("faults_minor", "minor faults", t.faults_minor),
    field("cache_fill_bytes", "page-cache fills", t.cache_fill_bytes, `${int(t.cache_fill_bytes)} B`),
  );
}

/** The bands around segment `at`, each a readable row with its name and reads across the view. */
function magnifier(sc: Scene, at: number, tensors: TensorMatrix | null): HTMLElement {
  const rows: number[] = [];
  for (let i = at; i >= 0 && rows.length <= MAGNIFIED_ROWS; i--) if (sc.ylay.segs[i].band >= 0) rows.unshift(i);
  for (let i = at + 1; i < sc.ylay.segs.length && rows.length <= 2 * MAGNIFIED_ROWS; i++) if (sc.ylay.segs[i].band >= 0) rows.push(i);
  const rowH = 14;
  const c = h("canvas", { class: "tt-magnifier", id: "memmap-magnifier", "data-rows": rows.length });
  const w = 360;
  c.width = w;
  c.height = rows.length * rowH;
  c.style.height = `${rows.length * rowH}px`;
  const g = c.getContext("2d");
  if (!g) return c;
  g.font = "10px system-ui, sans-serif";
  g.textBaseline = "middle";
  const stripX = 200;
  const stripW = w - stripX - 4;
  rows.forEach((si, r) => {
    const band = sc.bands[sc.ylay.segs[si].band];
    const y = r * rowH;
    g.fillStyle = si === at ? "#334155" : r % 2 ? "#111827" : "#0f172a";
    g.fillRect(0, y, w, rowH);
    g.fillStyle = hue(band.component ?? band.name);
    g.fillRect(2, y + 2, 6, rowH - 4);
    g.fillStyle = "#e2e8f0";
    g.fillText(band.name.length > 32 ? `${band.name.slice(0, 31)}…` : band.name, 12, y + rowH / 2);
    const row = band.tensor !== null ? tensors?.byTensor.get(band.tensor) : undefined;
    if (tensors && row) {
      for (let ix = 0; ix < tensors.nx; ix++) {
        const x0 = tensors.xFrom + ix * tensors.xBin;
        const f0 = (x0 - sc.x0) / (sc.x1 - sc.x0);
        const f1 = (x0 + tensors.xBin - sc.x0) / (sc.x1 - sc.x0);
        if (f1 <= 0 || f0 >= 1 || !(row[ix] > 0)) continue;
        g.fillStyle = rgb(ramp(0.08 + 0.92 * logT(row[ix], tensors.max)));
        g.fillRect(stripX + Math.max(0, f0) * stripW, y + 2, Math.max(1, (Math.min(1, f1) - Math.max(0, f0)) * stripW), rowH - 4);
      }
    }
  });
  return c;
}
