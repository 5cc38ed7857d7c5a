// What every view shares: the trace's dictionaries (meta), its ubatches and
// tokens (small: one row each), and the store.

import { getFrame, getJson } from "./api/client";
import type { Frame } from "./api/frame";
import type { Meta, TensorInfo } from "./api/types";
import { PHASES } from "./api/types";
import type { Store } from "./state";

export interface Ubatches {
  n: number;
  phase: Uint8Array;
  start: Float64Array;
  end: Float64Array;
  nTokens: Uint32Array;
  firstToken: Uint32Array;
  gen: Uint32Array;
  seq: Int32Array;
  ops: Float64Array;
}

export interface Tokens {
  n: number;
  ubatch: Uint32Array;
  tokenId: Int32Array;
  seq: Int32Array;
  pos: Int32Array;
  generated: Uint8Array;
}

export class Ctx {
  private tensorsById = new Map<number, TensorInfo>();

  constructor(
    readonly meta: Meta,
    readonly ub: Ubatches,
    readonly tokens: Tokens,
    readonly store: Store,
  ) {
    for (const t of meta.tensors) this.tensorsById.set(t.id, t);
  }

  static async load(store: Store): Promise<Ctx> {
    const [meta, u, t] = await Promise.all([getJson<Meta>("meta"), getFrame("ubatches"), getFrame("tokens")]);
    return new Ctx(meta, ubatches(u), tokens(t), store);
  }

  tensor(id: number | null | undefined): TensorInfo | undefined {
    return id === null || id === undefined ? undefined : this.tensorsById.get(id);
  }

  opName(id: number): string {
    return this.meta.op_names[id] ?? `op#${id}`;
  }

  phaseName(p: number): string {
    return PHASES[p] ?? `phase#${p}`;
  }

  /** The ubatch whose [start, end) holds time `t` (ns), or the nearest before it. */
  ubatchAt(t: number): number {
    const s = this.ub.start;
    let lo = 0;
    let hi = this.ub.n - 1;
    if (hi < 0) return -1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (s[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** The trace's time span: 0 to the end of its last event. */
  duration(): number {
    const last = this.ub.n ? this.ub.end[this.ub.n - 1] : 0;
    return Math.max(this.meta.trace.duration_ns || 0, last, 1);
  }
}

function ubatches(f: Frame): Ubatches {
  return {
    n: f.rows,
    phase: f.col("phase") as Uint8Array,
    start: f.col("start_ns") as Float64Array,
    end: f.col("end_ns") as Float64Array,
    nTokens: f.col("n_tokens") as Uint32Array,
    firstToken: f.col("first_token") as Uint32Array,
    gen: f.col("gen") as Uint32Array,
    seq: f.col("seq") as Int32Array,
    ops: f.col("ops") as Float64Array,
  };
}

function tokens(f: Frame): Tokens {
  return {
    n: f.rows,
    ubatch: f.col("ubatch") as Uint32Array,
    tokenId: f.col("token_id") as Int32Array,
    seq: f.col("seq") as Int32Array,
    pos: f.col("pos") as Int32Array,
    generated: f.col("generated") as Uint8Array,
  };
}
