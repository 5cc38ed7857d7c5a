// Lays out a ubatch's graph with dagre off the main thread: a graph of a
// few thousand nodes takes hundreds of milliseconds, which would freeze the
// page. The view caches each answer by graph shape and collapsed layers.

import { Graph, layout } from "@dagrejs/dagre";
import type { LayoutAnswer, LayoutRequest } from "./protocol";

const scope = self as unknown as {
  onmessage: ((e: MessageEvent<LayoutRequest>) => void) | null;
  postMessage(m: LayoutAnswer): void;
};

scope.onmessage = (e) => {
  const req = e.data;
  try {
    scope.postMessage(run(req));
  } catch (err) {
    scope.postMessage({ key: req.key, pos: [], edges: [], width: 0, height: 0, error: String(err) });
  }
};

function run(req: LayoutRequest): LayoutAnswer {
  const g = new Graph({ multigraph: false });
  g.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 28, edgesep: 6, marginx: 10, marginy: 10 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const n of req.nodes) g.setNode(String(n.id), { width: n.w, height: n.h });
  for (const [a, b] of req.edges) g.setEdge(String(a), String(b));
  layout(g);
  const pos = req.nodes.map((n) => {
    const v = g.node(String(n.id));
    return { x: v.x ?? 0, y: v.y ?? 0 };
  });
  const edges = req.edges.map(([a, b]) => g.edge(String(a), String(b))?.points ?? []);
  const graph = g.graph();
  return { key: req.key, pos, edges, width: graph.width ?? 0, height: graph.height ?? 0 };
}
