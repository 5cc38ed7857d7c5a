// The memory map's controls: track, x axis, what the colour counts, and the
// overlay toggles. Every control writes the store, so the URL keeps it.

import type { OverlayMetric, ReadMemory, Track, XAxis } from "../../api/types";
import { OVERLAY_METRICS, PHASES } from "../../api/types";
import type { Ctx } from "../../context";
import type { State } from "../../state";
import { OVERLAY_COLORS, rgb } from "../../ui/colors";
import { h } from "../../ui/dom";

const OVERLAY_LABELS: Record<OverlayMetric, string> = {
  fault_major: "major faults",
  fault_minor: "minor faults",
  cache_fill: "page-cache fills",
  block_read: "block reads",
  unused: "loaded, never used",
};

export function toolbar(ctx: Ctx): HTMLElement {
  const store = ctx.store;
  const select = (id: string, options: [string, string][], get: (s: State) => string, set: (s: State, v: string) => void) => {
    const el = h("select", { id, onchange: () => store.update((s) => set(s, el.value)) }, ...options.map(([v, label]) => h("option", { value: v }, label)));
    sync.push((s) => (el.value = get(s)));
    return el;
  };
  const sync: ((s: State) => void)[] = [];
  const opOptions: [string, string][] = [["", "all ops"], ...ctx.meta.op_names.map((n, i): [string, string] => [String(i), n])];
  const phaseOptions: [string, string][] = [["", "all phases"], ...PHASES.map((p, i): [string, string] => [String(i), p])];
  const overlays = OVERLAY_METRICS.map((m) => {
    const box = h("input", {
      type: "checkbox",
      id: `mm-overlay-${m}`,
      "data-overlay": m,
      onchange: () =>
        store.update((s) => {
          s.mm.overlays = box.checked ? [...new Set([...s.mm.overlays, m])] : s.mm.overlays.filter((x) => x !== m);
        }),
    });
    sync.push((s) => (box.checked = s.mm.overlays.includes(m)));
    return h("label", { class: "toggle" }, box, h("span", { class: "swatch", style: `background:${rgb(OVERLAY_COLORS[m])}` }), OVERLAY_LABELS[m]);
  });
  const minBand = h("input", { type: "checkbox", id: "mm-minband", onchange: () => store.update((s) => void (s.mm.minBand = minBand.checked)) });
  sync.push((s) => (minBand.checked = s.mm.minBand));
  const bar = h(
    "div",
    { class: "toolbar", id: "memmap-toolbar" },
    h("strong", {}, "Memory map"),
    select("mm-track", [["disk", "disk: GGUF files"], ["buffer", "buffers: copies, anon"]], (s) => s.mm.track, (s, v) => void ((s.mm.track = v as Track), (s.mm.y0 = s.mm.y1 = null))),
    select("mm-x", [["ubatch", "x: token (ubatch)"], ["time", "x: time"]], (s) => s.mm.x, (s, v) => void ((s.mm.x = v as XAxis), (s.mm.x0 = s.mm.x1 = null))),
    select("mm-memory", [["all", "reads: file + copies"], ["file", "reads: through the file"], ["copy", "reads: of copies"]], (s) => s.mm.memory, (s, v) => void (s.mm.memory = v as ReadMemory)),
    select("mm-op", opOptions, (s) => (s.mm.ops.length === 1 ? String(s.mm.ops[0]) : ""), (s, v) => void (s.mm.ops = v === "" ? [] : [Number(v)])),
    select("mm-phase", phaseOptions, (s) => (s.mm.phases.length === 1 ? String(s.mm.phases[0]) : ""), (s, v) => void (s.mm.phases = v === "" ? [] : [Number(v)])),
    ...overlays,
    h("label", { class: "toggle", title: "small tensors keep a minimum height" }, minBand, "min band"),
    h("button", { id: "mm-reset", onclick: () => store.update((s) => void (s.mm.x0 = s.mm.x1 = s.mm.y0 = s.mm.y1 = null)) }, "reset zoom"),
    h("span", { class: "hint" }, "wheel: bytes · shift+wheel: x · drag: pan · dbl-click: band"),
  );
  const apply = (s: State) => sync.forEach((f) => f(s));
  apply(store.state);
  store.subscribe(apply);
  return bar;
}
