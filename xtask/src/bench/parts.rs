//! The other parts: ingest throughput, trace size, export speed and the
//! profile of a traced run.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{Ctx, median, overhead};
use crate::{cache, shell};

/// One step of `tracer-user/benches/ingest.rs`: `threads` producers offering
/// `offered` calls/s in all (0 = unpaced) while the reader drains the ring.
pub struct IngestStep {
    pub traced: bool,
    pub threads: u32,
    pub offered: u64,
    pub achieved: f64,
    pub calls: u64,
    pub delivered: u64,
    pub lost: u64,
    pub secs: f64,
    pub reader_cpu_s: f64,
    pub producer_cpu_s: f64,
}

impl IngestStep {
    /// Every call reached the reader: nothing lost, nothing unaccounted for.
    pub fn lossless(&self) -> bool {
        self.lost == 0 && self.delivered == self.calls
    }

    /// `achieved` is calls over the producers' exact wall time (`secs` is rounded).
    pub fn delivered_per_s(&self) -> f64 {
        if self.calls == 0 { 0.0 } else { self.achieved * self.delivered as f64 / self.calls as f64 }
    }
}

pub struct Ingest {
    pub steps: Vec<IngestStep>,
    /// The reader alone: records per CPU second of one `drain_now` of a
    /// pre-filled ring, per fill.
    pub drain_per_s: Vec<f64>,
    /// The `# cores …` line: the set-up the bench ran with.
    pub setup: String,
    /// CPUs the producers and the reader shared (0: not printed).
    pub cores: u32,
}

pub fn ingest(ctx: &Ctx) -> Result<Ingest> {
    let secs = if ctx.quick { "0.5" } else { "2" };
    let out = shell::output(Command::new("cargo").current_dir(cache::repo_root()).args([
        "bench",
        "--quiet",
        "-p",
        "tracer-user",
        "--bench",
        "ingest",
        "--",
        secs,
    ]))?;
    parse_ingest(&out)
}

pub fn parse_ingest(out: &str) -> Result<Ingest> {
    let mut ingest = Ingest { steps: Vec::new(), drain_per_s: Vec::new(), setup: String::new(), cores: 0 };
    for line in out.lines() {
        let f: Vec<&str> = line.split(',').collect();
        match (f[0], f.len()) {
            ("step", 11) => ingest.steps.push(IngestStep {
                traced: f[1] == "1",
                threads: f[2].parse()?,
                offered: f[3].parse()?,
                achieved: f[4].parse()?,
                calls: f[5].parse()?,
                delivered: f[6].parse()?,
                lost: f[7].parse()?,
                secs: f[8].parse()?,
                reader_cpu_s: f[9].parse()?,
                producer_cpu_s: f[10].parse()?,
            }),
            ("drain", 7) => ingest.drain_per_s.push(f[5].parse()?),
            _ if line.starts_with("# cores ") => {
                ingest.setup = line.trim_start_matches("# ").to_string();
                ingest.cores = line["# cores ".len()..].split(',').next().unwrap_or("").trim().parse().unwrap_or(0);
            }
            _ => {}
        }
    }
    if ingest.steps.is_empty() {
        bail!("the ingest benchmark printed no steps:\n{out}");
    }
    Ok(ingest)
}

/// Trace size of one bench-model trace.
pub struct Size {
    pub op_frame: f64,
    pub op_frame_with_desc: f64,
    pub file_bytes: u64,
    pub ops: u64,
    pub io_records: u64,
    pub io_record_bytes: Option<f64>,
}

/// `… 17.6 bytes per op frame (31.5 with tensor descriptors)`.
fn parse_frame_bytes(summary: &str) -> Option<(f64, f64)> {
    let (head, rest) = summary.split_once(" bytes per op frame (")?;
    let a = head.rsplit([' ', ',']).next()?.parse().ok()?;
    let b = rest.split_whitespace().next()?.parse().ok()?;
    Some((a, b))
}

pub fn size(ctx: &Ctx, summary: &str, trace: &Path) -> Result<Size> {
    let (op_frame, op_frame_with_desc) =
        parse_frame_bytes(summary).with_context(|| format!("no frame sizes in `{summary}`"))?;
    let json = shell::output(Command::new(&ctx.ttrace).arg("report").arg("--json").arg(trace))?;
    let report: Value = serde_json::from_str(&json)?;
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let ops = n(&report["ops"]);
    let io = &report["io"];
    let io_records =
        n(&io["faults"]["total"]) + n(&io["page_cache_adds"]) + n(&io["disk"]["issues"]) + n(&io["disk"]["requests"]);
    let file_bytes = std::fs::metadata(trace)?.len();
    let rest = file_bytes as f64 - ops as f64 * op_frame_with_desc;
    let io_record_bytes = (io_records > 0 && rest > 0.0).then(|| rest / io_records as f64);
    Ok(Size { op_frame, op_frame_with_desc, file_bytes, ops, io_records, io_record_bytes })
}

/// Export speed of one format.
pub struct Export {
    pub format: &'static str,
    pub events: u64,
    pub secs: Vec<f64>,
    pub max_rss_kb: Option<u64>,
}

pub const FORMATS: [&str; 4] = ["jsonl", "csv", "parquet", "perfetto"];

pub fn export(ctx: &Ctx) -> Result<(u64, Vec<Export>)> {
    let model = ctx.paths.models.get("tiny").context("set-up generated no `tiny` model")?;
    let trace = ctx.out_dir.join("export-source.data");
    let tokens = if ctx.quick { "1000" } else { "7000" };
    eprintln!("bench: export source trace ({tokens} tokens on tiny, --all-threads)");
    let out = Command::new(&ctx.ttrace)
        .args(["run", "--all-threads", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(&ctx.paths.llama.completion)
        .arg("-m")
        .arg(model)
        .args(["-p", "hello world", "-n", tokens, "-c", "8192", "-no-cnv", "--ignore-eos", "-t", "2"])
        .stdout(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!("tracing the export source failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let trace_bytes = std::fs::metadata(&trace)?.len();
    let mut results: Vec<Export> =
        FORMATS.iter().map(|&format| Export { format, events: 0, secs: Vec::new(), max_rss_kb: None }).collect();
    let time_v = Path::new("/usr/bin/time").exists();
    for _ in 0..3 {
        for r in &mut results {
            let dest = ctx.out_dir.join(format!("export.{}", r.format));
            let mut cmd = if time_v {
                let mut c = Command::new("/usr/bin/time");
                c.arg("-v").arg(&ctx.ttrace);
                c
            } else {
                Command::new(&ctx.ttrace)
            };
            cmd.args(["export", "--format", r.format, "-o"]).arg(&dest).arg(&trace);
            let start = Instant::now();
            let out = cmd.stdout(Stdio::null()).output()?;
            let secs = start.elapsed().as_secs_f64();
            let err = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() {
                bail!("export {} failed: {err}", r.format);
            }
            // `ttrace: wrote … (N events, M items) in …`
            r.events = err
                .split_once(" events, ")
                .and_then(|(h, _)| h.rsplit('(').next())
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(r.events);
            r.max_rss_kb = err
                .lines()
                .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
                .and_then(|v| v.trim().parse().ok())
                .or(r.max_rss_kb);
            r.secs.push(secs);
            let _ = std::fs::remove_file(&dest);
        }
    }
    Ok((trace_bytes, results))
}

/// Where a traced (B) run's time goes.
pub struct Profile {
    pub tokens_per_s: Option<f64>,
    /// (program name, run_cnt, run_time_ns).
    pub programs: Vec<(String, u64, u64)>,
    pub perf_stat: Option<String>,
}

fn bpf_progs() -> Vec<(String, u64, u64)> {
    let Ok(out) = shell::output(Command::new("bpftool").args(["prog", "show", "--json"])) else {
        return Vec::new();
    };
    let progs: Vec<Value> = serde_json::from_str(&out).unwrap_or_default();
    progs
        .iter()
        .filter_map(|p| {
            let cnt = p["run_cnt"].as_u64()?;
            Some((p["name"].as_str()?.to_string(), cnt, p["run_time_ns"].as_u64().unwrap_or(0)))
        })
        .filter(|(_, cnt, _)| *cnt > 0)
        .collect()
}

pub fn profile(ctx: &Ctx, model: &Path) -> Result<Profile> {
    let trace = ctx.out_dir.join("profile-B.data");
    let stats_before = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1").context("enabling kernel.bpf_stats_enabled")?;
    let mut cmd = overhead::command(ctx, "B", model, 2, &trace)?;
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let perf = Command::new("perf")
        .args(["stat", "-x,", "-e", "task-clock,context-switches,cpu-migrations", "-p"])
        .arg(child.id().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok();
    // Sample the programs' counters while they are attached (they go with ttrace).
    let mut programs = Vec::new();
    let reader = std::thread::spawn(move || child.wait_with_output());
    while !reader.is_finished() {
        let now = bpf_progs();
        if now.iter().any(|p| p.0 == "graph_compute") {
            programs = now;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = reader.join().map_err(|_| anyhow::anyhow!("profile reader panicked"))??;
    let perf_stat = perf.and_then(|p| p.wait_with_output().ok()).map(|o| {
        String::from_utf8_lossy(&o.stderr)
            .lines()
            .filter(|l| l.contains(','))
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                format!("{} {} {}", f[2], f[0], f[1])
            })
            .collect::<Vec<_>>()
            .join("; ")
    });
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_before.trim());
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let tokens_per_s = overhead::eval_tokens_per_s(&text);
    programs.retain(|p| {
        ["graph_compute", "argsort", "call_", "ubatch", "ggml", "page", "filemap", "block"]
            .iter()
            .any(|k| p.0.starts_with(k))
    });
    Ok(Profile { tokens_per_s, programs, perf_stat: perf_stat.filter(|s| !s.is_empty()) })
}

pub fn median_secs(e: &Export) -> f64 {
    median(&e.secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ingest_output() {
        let out = "# cores 2, ring 16777216 bytes\n\
                   # step,traced,threads,offered_per_s,achieved_per_s,calls,delivered,lost,secs,reader_cpu_s,producer_cpu_s\n\
                   step,0,1,0,219108653,67170816,0,0,0.307,0.000,0.122\n\
                   step,1,2,2000000,1999000,3998000,3997000,1000,2.000,0.050,1.900\n\
                   # drain,threads,records,secs,cpu_s,records_per_cpu_s,lost\n\
                   drain,2,152520,0.019910,0.019000,8027368,0\n";
        let ingest = parse_ingest(out).unwrap();
        assert_eq!((ingest.setup.as_str(), ingest.cores), ("cores 2, ring 16777216 bytes", 2));
        assert_eq!(ingest.steps.len(), 2);
        let s = &ingest.steps[1];
        assert!(s.traced && s.threads == 2 && s.offered == 2_000_000 && s.lost == 1000 && !s.lossless());
        assert!(ingest.steps[0].lossless() || !ingest.steps[0].traced);
        assert_eq!(ingest.drain_per_s, vec![8027368.0]);
    }
}
