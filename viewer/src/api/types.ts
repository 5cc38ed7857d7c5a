// Shapes of the JSON answers (docs/VIEW_API.md section 2) and the ids and
// enumerations every view shares.

export const PHASES = ["warmup", "prompt", "generate", "aux"] as const;
export type Phase = (typeof PHASES)[number];
export const MEMORY = ["model_file", "copy", "anon", "other_file", "unmapped"] as const;
export type MemoryClass = (typeof MEMORY)[number];

export type Track = "disk" | "buffer";
export type XAxis = "ubatch" | "time";
export type GridMetric = "read" | "fault_major" | "fault_minor" | "cache_fill" | "block_read" | "unused";
export const OVERLAY_METRICS = ["fault_major", "fault_minor", "cache_fill", "block_read", "unused"] as const;
export type OverlayMetric = (typeof OVERLAY_METRICS)[number];
export type ReadMemory = "all" | "file" | "copy";

export interface TensorInfo {
  id: number;
  model: number;
  file: number;
  name: string;
  offset: number;
  size: number;
  type: string;
  shape: number[];
  layer: number | null;
  component: string;
  n_experts: number | null;
  expert_bytes: number | null;
  y0: number;
}

export interface Meta {
  trace: {
    path: string;
    bytes: number;
    truncated: boolean;
    op_timing: boolean;
    duration_ns: number;
    command: string[] | string;
    mode: string;
  };
  counts: { ubatches: number; tokens: number; ops: number; faults: number; generated: number; prompt: number };
  op_names: string[];
  models: { files: { path: string; size: number; y0: number }[]; architecture: string }[];
  tensors: TensorInfo[];
  layers: number[];
  components: string[];
  moe: { layer: number; n_expert: number; k: number }[];
  sequences: number[];
  tracks: { disk: { size: number }; buffer: { size: number } };
}

export interface Band {
  y0: number;
  y1: number;
  tensor: number | null;
  name: string;
  layer: number | null;
  component: string | null;
  memory: MemoryClass | string;
}

export interface Bands {
  size: number;
  bands: Band[];
  experts: { tensor: number; expert: number; y0: number; y1: number }[];
  groups: { layer: number; y0: number; y1: number }[];
}

/** One tensor under a memory-map cell (`memmap/cell`). */
export interface CellTensor {
  tensor: number;
  name: string;
  y0: number;
  y1: number;
  read_bytes: number;
  report_bytes: number;
  /** How many reads, and how many distinct ops, fall in the cell; `ops` holds the first 16 op ids. */
  reads: number;
  op_count: number;
  ops: number[];
  ubatches: number;
  tokens: number[];
  disk_bytes: number;
  faults_major: number;
  faults_minor: number;
  cache_fill_bytes: number;
}

export interface GridMeta {
  x_bin: number;
  x_from: number;
  x_to: number;
  nx: number;
  y_bin: number;
  y_from: number;
  y_to: number;
  ny: number;
  max: number;
}

export interface GraphNode {
  op: number;
  name: string;
  dst: string;
  layer: number | null;
  memory: MemoryClass | string;
  weights: number[];
}

export interface GraphAnswer {
  ubatch: number;
  shape: string;
  nodes: GraphNode[];
  edges: [number, number][];
}

export interface TimelineTrack {
  id: string;
  rows?: number;
}

/** The report's per-layer MoE entry (`ttrace report --json` stats.moe.layers). */
export interface MoeLayer {
  layer: number;
  n_expert: number;
  k: number;
  phases: {
    phase: Phase | string;
    tokens: number;
    activations: number[];
    pairs: [number, number, number][];
    stickiness: number | null;
    token_pairs: number;
  }[];
  experts: {
    expert: number;
    size_bytes: number;
    loaded: number;
    disk: number;
    used: number;
    loaded_unused: number;
    disk_read: number;
    faults: number;
  }[];
}

export interface MoeAnswer {
  layers: MoeLayer[];
  notes?: string[];
}

/** A JSON value of unknown shape (lookups and the report, shown as they come). */
export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

/** A 202 answer: a computation in the background, this fraction (0 to 1) done. */
export interface Computing {
  state: "computing";
  progress: number;
}

/** `/api/v1/simulate`: `ttrace simulate TRACE --json`'s document. */
export type SimPolicy = "lru" | "opt" | "2q";
export interface SimRow {
  budget_bytes: number;
  cache_bytes: number;
  policy: SimPolicy;
  disk_bytes: number;
  disk_bytes_per_token: number | null;
  misses: number;
}
export interface SimulateAnswer {
  trace: string;
  page_bytes: number;
  readahead: { window_bytes: number; fault_around_bytes: number } | null;
  readahead_source: string;
  phase: "generate" | "all";
  populate: boolean;
  anon_bytes: number;
  anon_source: string;
  generated_tokens: number;
  /** Present when the replay stopped before the trace's end (simulate's `--tokens`). */
  window?: { ubatch: number; tokens: number; trace_tokens: number };
  footprint_bytes: number;
  fit_budget_bytes: number | null;
  first_read_bytes: number | null;
  rows: SimRow[];
}
