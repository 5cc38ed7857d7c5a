// Messages between the graph view and its layout worker.

export interface LayoutRequest {
  key: string;
  nodes: { id: number; w: number; h: number }[];
  edges: [number, number][];
}

export interface LayoutAnswer {
  key: string;
  /** Node centres, in request order. */
  pos: { x: number; y: number }[];
  /** Edge polylines, in request order. */
  edges: { x: number; y: number }[][];
  width: number;
  height: number;
  error?: string;
}
