// The app's state: what is selected (numeric ids shared by every view) and
// how each view is set. It lives in the URL hash, so a view reloads and
// shares as it is; views subscribe and re-read what they draw from.

import type { OverlayMetric, ReadMemory, Track, XAxis } from "./api/types";
import { OVERLAY_METRICS } from "./api/types";

export type Tab = "ops" | "graph" | "moe" | "summary" | "simulate";
export type OpSort = "op_seq" | "dur" | "weight_bytes" | "layer" | "ubatch";

export interface Selection {
  ubatch: number | null;
  token: number | null;
  op: number | null;
  tensor: number | null;
  layer: number | null;
  /** (layer, expert) */
  expert: [number, number] | null;
  seq: number | null;
}

export interface MemmapState {
  track: Track;
  x: XAxis;
  /** Visible range; null: the whole axis. */
  x0: number | null;
  x1: number | null;
  y0: number | null;
  y1: number | null;
  memory: ReadMemory;
  /** Op-name ids and phases the `read` colour is limited to (empty: all). */
  ops: number[];
  phases: number[];
  overlays: OverlayMetric[];
  /** Tensors keep a minimum height on the byte axis. */
  minBand: boolean;
}

export interface OpsState {
  op: number[];
  layer: number[];
  seq: number[];
  name: string;
  phase: number[];
  memory: number[];
  fromUbatch: number | null;
  toUbatch: number | null;
  sort: OpSort;
  desc: boolean;
  /** The selection (tensor, layer, ubatch, sequence) filters the table too. */
  linked: boolean;
}

export interface State {
  sel: Selection;
  mm: MemmapState;
  ops: OpsState;
  tl: { t0: number | null; t1: number | null };
  tab: Tab;
}

export function initialState(): State {
  return {
    sel: { ubatch: null, token: null, op: null, tensor: null, layer: null, expert: null, seq: null },
    mm: {
      track: "disk",
      x: "ubatch",
      x0: null,
      x1: null,
      y0: null,
      y1: null,
      memory: "all",
      ops: [],
      phases: [],
      overlays: [],
      minBand: true,
    },
    ops: {
      op: [],
      layer: [],
      seq: [],
      name: "",
      phase: [],
      memory: [],
      fromUbatch: null,
      toUbatch: null,
      sort: "op_seq",
      desc: false,
      linked: true,
    },
    tl: { t0: null, t1: null },
    tab: "ops",
  };
}

// ---------------------------------------------------------------- URL codec
// One entry per field: its key in the hash, how to read it from the state,
// and how to write a parsed value back. Defaults are left out of the URL.

type Field = {
  key: string;
  get: (s: State) => string | null;
  set: (s: State, v: string) => void;
};

const num = (v: string): number | null => (v === "" || Number.isNaN(Number(v)) ? null : Number(v));
const nums = (v: string): number[] => v.split(",").map(Number).filter((n) => Number.isFinite(n));
const optNum = (n: number | null): string | null => (n === null ? null : String(n));
const list = (a: readonly (string | number)[]): string | null => (a.length ? a.join(",") : null);

function oneOf<T extends string>(allowed: readonly T[], v: string, fallback: T): T {
  return (allowed as readonly string[]).includes(v) ? (v as T) : fallback;
}

const FIELDS: Field[] = [
  ...(["ubatch", "token", "op", "tensor", "layer", "seq"] as const).map(
    (k): Field => ({ key: k, get: (s) => optNum(s.sel[k]), set: (s, v) => void (s.sel[k] = num(v)) }),
  ),
  {
    key: "expert",
    get: (s) => (s.sel.expert ? s.sel.expert.join(".") : null),
    set: (s, v) => {
      const [l, e] = v.split(".").map(Number);
      s.sel.expert = Number.isFinite(l) && Number.isFinite(e) ? [l, e] : null;
    },
  },
  { key: "tab", get: (s) => (s.tab === "ops" ? null : s.tab), set: (s, v) => void (s.tab = oneOf(["ops", "graph", "moe", "summary", "simulate"], v, "ops")) },
  { key: "mm.track", get: (s) => (s.mm.track === "disk" ? null : s.mm.track), set: (s, v) => void (s.mm.track = oneOf(["disk", "buffer"], v, "disk")) },
  { key: "mm.x", get: (s) => (s.mm.x === "ubatch" ? null : s.mm.x), set: (s, v) => void (s.mm.x = oneOf(["ubatch", "time"], v, "ubatch")) },
  ...(["x0", "x1", "y0", "y1"] as const).map(
    (k): Field => ({ key: `mm.${k}`, get: (s) => optNum(s.mm[k]), set: (s, v) => void (s.mm[k] = num(v)) }),
  ),
  { key: "mm.memory", get: (s) => (s.mm.memory === "all" ? null : s.mm.memory), set: (s, v) => void (s.mm.memory = oneOf(["all", "file", "copy"], v, "all")) },
  { key: "mm.op", get: (s) => list(s.mm.ops), set: (s, v) => void (s.mm.ops = nums(v)) },
  { key: "mm.phase", get: (s) => list(s.mm.phases), set: (s, v) => void (s.mm.phases = nums(v)) },
  {
    key: "mm.overlay",
    get: (s) => list(s.mm.overlays),
    set: (s, v) => void (s.mm.overlays = v.split(",").filter((m): m is OverlayMetric => (OVERLAY_METRICS as readonly string[]).includes(m))),
  },
  { key: "mm.minband", get: (s) => (s.mm.minBand ? null : "0"), set: (s, v) => void (s.mm.minBand = v !== "0") },
  { key: "ops.op", get: (s) => list(s.ops.op), set: (s, v) => void (s.ops.op = nums(v)) },
  { key: "ops.layer", get: (s) => list(s.ops.layer), set: (s, v) => void (s.ops.layer = nums(v)) },
  { key: "ops.seq", get: (s) => list(s.ops.seq), set: (s, v) => void (s.ops.seq = nums(v)) },
  { key: "ops.name", get: (s) => s.ops.name || null, set: (s, v) => void (s.ops.name = v) },
  { key: "ops.phase", get: (s) => list(s.ops.phase), set: (s, v) => void (s.ops.phase = nums(v)) },
  { key: "ops.memory", get: (s) => list(s.ops.memory), set: (s, v) => void (s.ops.memory = nums(v)) },
  { key: "ops.from", get: (s) => optNum(s.ops.fromUbatch), set: (s, v) => void (s.ops.fromUbatch = num(v)) },
  { key: "ops.to", get: (s) => optNum(s.ops.toUbatch), set: (s, v) => void (s.ops.toUbatch = num(v)) },
  {
    key: "ops.sort",
    get: (s) => (s.ops.sort === "op_seq" ? null : s.ops.sort),
    set: (s, v) => void (s.ops.sort = oneOf(["op_seq", "dur", "weight_bytes", "layer", "ubatch"], v, "op_seq")),
  },
  { key: "ops.desc", get: (s) => (s.ops.desc ? "1" : null), set: (s, v) => void (s.ops.desc = v === "1") },
  { key: "ops.linked", get: (s) => (s.ops.linked ? null : "0"), set: (s, v) => void (s.ops.linked = v !== "0") },
  ...(["t0", "t1"] as const).map(
    (k): Field => ({ key: `tl.${k}`, get: (s) => optNum(s.tl[k]), set: (s, v) => void (s.tl[k] = num(v)) }),
  ),
];

export function encodeHash(s: State): string {
  const q = new URLSearchParams();
  for (const f of FIELDS) {
    const v = f.get(s);
    if (v !== null) q.set(f.key, v);
  }
  return q.toString();
}

export function decodeHash(hash: string): State {
  const s = initialState();
  const q = new URLSearchParams(hash.replace(/^#/, ""));
  for (const f of FIELDS) {
    const v = q.get(f.key);
    if (v !== null) f.set(s, v);
  }
  return s;
}

// -------------------------------------------------------------------- store

export type Listener = (s: State, prev: State) => void;

export class Store {
  private listeners: Listener[] = [];
  private writing = false;

  constructor(public state: State) {
    window.addEventListener("hashchange", () => {
      if (!this.writing) this.replace(decodeHash(location.hash));
    });
  }

  subscribe(l: Listener): void {
    this.listeners.push(l);
  }

  /** Applies `change` to a copy of the state, writes the URL, tells every view. */
  update(change: (s: State) => void): void {
    const next = structuredClone(this.state);
    change(next);
    this.replace(next);
  }

  select(sel: Partial<Selection>): void {
    this.update((s) => Object.assign(s.sel, sel));
  }

  private replace(next: State): void {
    const prev = this.state;
    this.state = next;
    const hash = encodeHash(next);
    if (hash !== location.hash.replace(/^#/, "")) {
      this.writing = true;
      history.replaceState(null, "", hash ? `#${hash}` : location.pathname + location.search);
      this.writing = false;
    }
    for (const l of this.listeners) l(next, prev);
  }
}

/** Whether the part of the state a view reads changed (structural). */
export function changed<T>(a: T, b: T): boolean {
  return JSON.stringify(a) !== JSON.stringify(b);
}
