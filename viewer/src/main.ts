// `ttrace view`'s front end: loads the trace's dictionaries, then builds the
// linked views. Everything they share goes through the store, whose state is
// the URL hash.

import { Ctx } from "./context";
import { decodeHash, type Selection, type State, Store, type Tab } from "./state";
import { byId, h, showError } from "./ui/dom";
import { bytes, int } from "./ui/format";
import { Details } from "./views/details";
import { GraphView } from "./views/graph";
import { MemmapView } from "./views/memmap/memmap";
import { MoeView } from "./views/moe";
import { OpTable } from "./views/optable";
import { SimulateView } from "./views/simulate";
import { SummaryView } from "./views/summary";
import { Timeline } from "./views/timeline";

/** What the browser tests read and drive (tests/python/test_view.py). */
export interface TestHook {
  state(): State;
  select(sel: Partial<Selection>): void;
  update(change: (s: State) => void): void;
  memmapLit(box: { x0: number; x1: number; y0: number; y1: number }): { x0: number; x1: number; y0: number; y1: number; v: number }[];
  /** Client pixel where the memory map draws (x, byte y); x null: its gutter. */
  memmapPoint(x: number | null, y: number): { x: number; y: number } | null;
}

declare global {
  interface Window {
    __ttraceView?: TestHook;
  }
}

const TABS: [Tab, string][] = [
  ["ops", "Ops"],
  ["graph", "Graph"],
  ["moe", "MoE"],
  ["summary", "Summary"],
  ["simulate", "Memory"],
];

async function main(): Promise<void> {
  const store = new Store(decodeHash(location.hash));
  const app = byId("app");
  let ctx: Ctx;
  try {
    ctx = await Ctx.load(store);
  } catch (e) {
    showError(app, e);
    return;
  }
  header(ctx);
  const memmap = new MemmapView(ctx, byId("memmap"));
  new Timeline(ctx, byId("timeline"));
  new OpTable(ctx, byId("tab-ops"));
  const graph = new GraphView(ctx, byId("tab-graph"));
  const moe = new MoeView(ctx, byId("tab-moe"));
  const summary = new SummaryView(ctx, byId("tab-summary"));
  const simulate = new SimulateView(byId("tab-simulate"));
  new Details(ctx, byId("details"));

  // Tabs: a view loads when first shown.
  const nav = byId("tabs");
  for (const [tab, label] of TABS) nav.append(h("button", { "data-tab": tab, id: `tab-button-${tab}`, onclick: () => store.update((s) => void (s.tab = tab)) }, label));
  const showTab = (s: State) => {
    for (const [tab] of TABS) {
      byId(`tab-${tab}`).hidden = tab !== s.tab;
      nav.querySelector(`[data-tab=${tab}]`)?.classList.toggle("active", tab === s.tab);
    }
    if (s.tab === "graph") graph.activate();
    if (s.tab === "moe") moe.activate();
    if (s.tab === "summary") summary.activate();
    if (s.tab === "simulate") simulate.activate();
  };
  showTab(store.state);
  store.subscribe((s, prev) => s.tab !== prev.tab && showTab(s));

  window.__ttraceView = {
    state: () => store.state,
    select: (sel) => store.select(sel),
    update: (change) => store.update(change),
    memmapLit: (box) => memmap.lit(box),
    memmapPoint: (x, y) => memmap.point(x, y),
  };
  document.body.dataset.ready = "1";
}

function header(ctx: Ctx): void {
  const m = ctx.meta;
  const t = m.trace;
  const c = m.counts;
  const title = byId("trace-info");
  title.append(
    h("span", { id: "trace-path", title: Array.isArray(t.command) ? t.command.join(" ") : String(t.command ?? "") }, t.path),
    h("span", {}, `${m.models.map((x) => x.architecture).join(", ")} · ${int(c.ubatches)} ubatches · ${int(c.tokens)} tokens · ${int(c.ops)} ops · ${int(c.faults)} faults · ${bytes(t.bytes)}`),
  );
  if (t.truncated) title.append(h("span", { class: "warn" }, "truncated trace: shown up to its last complete frame"));
  if (!t.op_timing) title.append(h("span", { class: "hint" }, "no --op-timing: no op slices"));
  document.title = `ttrace view · ${t.path}`;
}

void main();
