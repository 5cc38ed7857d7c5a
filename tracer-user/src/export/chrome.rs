//! Chrome Trace Event Format JSON (`{"traceEvents": [...]}`), for small
//! traces and tools that do not read Perfetto's protobuf. The same content
//! as [`super::perfetto`]: complete (`X`) events per op on its thread, a
//! `ubatches` thread (tid 0), a `model: FILE` process per model with one
//! thread per layer (tid = layer + 1, 0 = non-layer), fault instants and a
//! `page faults per 10 ms` counter. Timestamps are µs since tracing started.

use std::{
    collections::{BTreeSet, HashMap},
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use indicatif::ProgressBar;
use serde_json::{Value, json};
use tracer_common::markers;

use super::{
    ExportError, Written,
    buckets::{Buckets, Points},
    rows::{phase_name, row},
    ubatch_weights::UbatchWeights,
};
use crate::analyze::Analysis;
use crate::analyze::{
    tensor::{model_tensor, weight_of},
    walk::{self, Event, Sink, Tables},
};

/// Model pseudo-processes: pid = MODEL_PID + model index.
const MODEL_PID: u64 = 1 << 30;

struct ChromeSink<W: Write> {
    out: W,
    start: u64,
    pid: u32,
    events: u64,
    threads: BTreeSet<u32>,
    layer_end: HashMap<(u32, u64), u64>,
    faults_per_bucket: Buckets,
    /// Graph capture: the weights the current ubatch's untimed ops read.
    ubatch_weights: UbatchWeights,
}

pub fn write(trace: &Path, a: &Analysis, out: &Path, progress: &ProgressBar) -> Result<Written, ExportError> {
    let file = File::create(out).map_err(ExportError::write(out))?;
    let mut sink = ChromeSink {
        out: BufWriter::with_capacity(1 << 20, file),
        start: a.header.start_monotonic_ns,
        pid: a.header.pid,
        events: 0,
        threads: BTreeSet::new(),
        layer_end: HashMap::new(),
        faults_per_bucket: Buckets::default(),
        ubatch_weights: UbatchWeights::default(),
    };
    let run = |sink: &mut ChromeSink<BufWriter<File>>| -> Result<(), ExportError> {
        sink.out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n").map_err(io)?;
        let process = a.header.command.first().map_or("target", |c| c.rsplit('/').next().unwrap_or(c));
        sink.emit(json!({"ph":"M","name":"process_name","pid":sink.pid,"tid":0,"args":{"name":process}}))?;
        sink.emit(json!({"ph":"M","name":"thread_name","pid":sink.pid,"tid":0,"args":{"name":"ubatches"}}))?;
        for (m, model) in a.models.iter().enumerate() {
            let file = model.files.first().map_or("model", |f| f.rsplit('/').next().unwrap_or(f));
            let pid = MODEL_PID + m as u64;
            sink.emit(
                json!({"ph":"M","name":"process_name","pid":pid,"tid":0,"args":{"name":format!("model: {file}")}}),
            )?;
            let layers: BTreeSet<Option<u32>> = model.tensors.iter().map(|t| t.layer).collect();
            for layer in layers {
                let name = layer.map_or_else(|| "non-layer".to_string(), |l| format!("layer {l}"));
                let tid = layer.map_or(0, |l| u64::from(l) + 1);
                sink.emit(json!({"ph":"M","name":"thread_name","pid":pid,"tid":tid,"args":{"name":name}}))?;
                sink.emit(json!({"ph":"M","name":"thread_sort_index","pid":pid,"tid":tid,"args":{"sort_index":tid}}))?;
            }
        }
        walk::walk(trace, a, progress, sink)?;
        sink.flush_faults()?;
        // A closing metadata event saves tracking the last comma.
        sink.out.write_all(b"{\"ph\":\"M\",\"name\":\"trace_end\",\"pid\":0,\"tid\":0}\n]}\n").map_err(io)
    };
    run(&mut sink).map_err(|e| match e {
        ExportError::Write { source, .. } => ExportError::Write { path: out.display().to_string(), source },
        e => e,
    })?;
    sink.out.flush().map_err(ExportError::write(out))?;
    Ok(Written { events: progress.position(), items: sink.events })
}

fn io(source: std::io::Error) -> ExportError {
    ExportError::Write { path: String::new(), source }
}

impl<W: Write> ChromeSink<W> {
    fn emit(&mut self, v: Value) -> Result<(), ExportError> {
        serde_json::to_writer(&mut self.out, &v).map_err(|e| io(e.into()))?;
        self.events += 1;
        self.out.write_all(b",\n").map_err(io)
    }

    fn us(&self, ts: u64) -> f64 {
        ts.saturating_sub(self.start) as f64 / 1000.0
    }

    fn count_fault(&mut self, ts: u64) -> Result<(), ExportError> {
        let points = self.faults_per_bucket.add(ts, 1);
        self.fault_points(points)
    }

    fn flush_faults(&mut self) -> Result<(), ExportError> {
        let points = self.faults_per_bucket.finish();
        self.fault_points(points)
    }

    fn fault_points(&mut self, points: Points) -> Result<(), ExportError> {
        for (ts, n) in points.into_iter().flatten() {
            let ts = self.us(ts);
            self.emit(
                json!({"ph":"C","name":"page faults per 10 ms","pid":self.pid,"tid":0,"ts":ts,"args":{"faults":n}}),
            )?;
        }
        Ok(())
    }
}

impl<W: Write> Sink for ChromeSink<W> {
    type Error = ExportError;

    fn event(&mut self, event: &Event, t: &Tables) -> Result<(), ExportError> {
        match event {
            // Ops captured with their graph have no time of their own: the
            // timeline shows their ubatch (op slices need --op-timing), and
            // the weights they read over it.
            Event::Op(e) if !e.op.timed() => self.ubatch_weights.note(e, t),
            Event::Op(e) => {
                let Some(r) = row(event, t) else { return Ok(()) };
                if self.threads.insert(r.tid) {
                    let name = format!("thread {}", r.tid);
                    self.emit(json!({"ph":"M","name":"thread_name","pid":self.pid,"tid":r.tid,"args":{"name":name}}))?;
                }
                let end = e.end_ns.unwrap_or(e.op.ts_ns);
                let (ts, dur) = (self.us(e.op.ts_ns), end.saturating_sub(e.op.ts_ns) as f64 / 1000.0);
                self.emit(json!({"ph":"X","name":r.name,"cat":"op","pid":self.pid,"tid":r.tid,"ts":ts,"dur":dur,
                    "args":{"dst":r.dst,"srcs":r.srcs,"weight_bytes":r.weight_bytes,"memory":r.dst_memory,
                            "layer":r.layer,"ubatch":r.ubatch,"seq":r.seq}}))?;
                if e.op.ith != 0 {
                    return Ok(());
                }
                let mut seen = BTreeSet::new();
                for &(_, id) in e.op.srcs.iter() {
                    let d = t.descriptor(id);
                    let Some(w) = weight_of(d) else { continue };
                    let Some(tensor) = model_tensor(t.models, w.model, w.tensor) else { continue };
                    let tid = tensor.layer.map_or(0, |l| u64::from(l) + 1);
                    if !seen.insert((w.model, tid)) {
                        continue;
                    }
                    let begin = e.op.ts_ns.max(self.layer_end.get(&(w.model, tid)).copied().unwrap_or(0));
                    if begin >= end {
                        continue;
                    }
                    self.layer_end.insert((w.model, tid), end);
                    let (ts, dur) = (self.us(begin), (end - begin) as f64 / 1000.0);
                    let memory = if w.copy { "copy" } else { "model_file" };
                    self.emit(json!({"ph":"X","name":tensor.name,"cat":"weight","pid":MODEL_PID + u64::from(w.model),
                        "tid":tid,"ts":ts,"dur":dur,"args":{"memory":memory,"size_bytes":tensor.size_bytes}}))?;
                }
            }
            Event::Marker(ctx, m) if m.cookie == markers::SCHED_GRAPH_COMPUTE_RETURN => {
                let Some(u) = ctx.ubatch else { return Ok(()) };
                let Some(ub) = t.analysis.ubatches.get(u as usize) else { return Ok(()) };
                let phase = phase_name(ub.phase);
                let name = match t.token_index(Some(u)) {
                    Some(k) => format!("ubatch {u} ({phase}, token {k})"),
                    None => format!("ubatch {u} ({phase})"),
                };
                let (ts, dur) = (self.us(ub.start_ns), m.ts_ns.saturating_sub(ub.start_ns) as f64 / 1000.0);
                self.emit(json!({"ph":"X","name":name,"cat":"ubatch","pid":self.pid,"tid":0,"ts":ts,"dur":dur,
                    "args":{"ops":ub.ops,"n_tokens":ub.n_tokens,"token_ids":ub.token_ids}}))?;
                for ((model, layer), weights) in self.ubatch_weights.take() {
                    let tid = layer.map_or(0, |l| u64::from(l) + 1);
                    for (m, x, copy) in weights {
                        let Some(tensor) = model_tensor(t.models, m, x) else { continue };
                        let memory = if copy { "copy" } else { "model_file" };
                        self.emit(
                            json!({"ph":"X","name":tensor.name,"cat":"weight","pid":MODEL_PID + u64::from(model),
                            "tid":tid,"ts":ts,"dur":dur,"args":{"memory":memory,"size_bytes":tensor.size_bytes}}),
                        )?;
                    }
                }
            }
            Event::Fault(f) => {
                self.count_fault(f.fault.ts_ns)?;
                let tensor = f.hit.and_then(|h| Some(model_tensor(t.models, h.model, h.tensor?)?.name.clone()));
                let ts = self.us(f.fault.ts_ns);
                self.emit(json!({"ph":"i","s":"t","name":"page_fault","pid":self.pid,"tid":f.fault.tid,"ts":ts,
                    "args":{"address":format!("{:#x}", f.fault.address),"tensor":tensor,"op_seq":f.op_seq}}))?;
            }
            _ => {}
        }
        Ok(())
    }
}
