//! The other parts: ingest throughput, trace size, export speed and the
//! profile of a traced run.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{Ctx, median, met, overhead};
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

pub fn size_section(md: &mut String, size: Option<&Size>) -> Result<()> {
    writeln!(md, "## Trace size\n")?;
    if let Some(z) = size {
        writeln!(md, "From the last B run of the overhead part (`ttrace run` summary and `ttrace report --json`):\n")?;
        writeln!(md, "- {} ops, trace file {} bytes", z.ops, z.file_bytes)?;
        writeln!(
            md,
            "- {:.1} bytes per op frame on average; {:.1} including the one-off tensor descriptors",
            z.op_frame, z.op_frame_with_desc
        )?;
        match z.io_record_bytes {
            Some(io) => writeln!(
                md,
                "- ≈ {io:.1} bytes per I/O record: (file size − ops × op-frame-with-descriptors bytes) / {} I/O records (faults + page-cache adds + block issues + completions); this also charges headers, markers and the trailer to I/O",
                z.io_records
            )?,
            None => writeln!(md, "- I/O record bytes: not derivable ({} I/O records)", z.io_records)?,
        }
        writeln!(
            md,
            "\n- Goal ≤ 32 bytes per op record: {} ({:.1}; {:.1} with descriptors)\n",
            met(z.op_frame <= 32.0),
            z.op_frame,
            z.op_frame_with_desc
        )?;
    } else {
        writeln!(md, "No B run summary line found; size not measured.\n")?;
    }

    Ok(())
}

pub fn size_csv(csv: &mut String, size: Option<&Size>) -> Result<()> {
    if let Some(z) = size {
        writeln!(csv, "size_bytes_per_op_frame,B,,{}", z.op_frame)?;
        writeln!(csv, "size_bytes_per_op_frame_with_desc,B,,{}", z.op_frame_with_desc)?;
        writeln!(csv, "size_file_bytes,B,,{}", z.file_bytes)?;
        writeln!(csv, "size_ops,B,,{}", z.ops)?;
        writeln!(csv, "size_io_records,B,,{}", z.io_records)?;
    }
    Ok(())
}

pub fn ingest_section(md: &mut String, ingest: &Ingest) -> Result<()> {
    writeln!(md, "## Ingest throughput\n")?;
    writeln!(
        md,
        "`tracer-user/benches/ingest.rs`: producer threads call a `#[no_mangle]` function (naked, starting with `push rbp` like the ggml functions; a Rust leaf starting with `mov` is single-stepped and costs ~16 µs per hit here) uprobed with ttrace's \
         call-argument program, each busy-wait paced to offered / threads (sleeping when ahead), while the reader drains the ring concurrently with `ttrace run`'s \
         code and settings: `EventStream::drain_now`, woken at a quarter-full ring plus a 20 ms drain timer, every event passed to the trace `Recorder` (writing to `io::sink()`). \
         Delivered = call events the reader decoded; lost = the program's per-CPU lost counter. Offered 0 = unpaced. The reader shares the machine's cores with the producers ({}).\n",
        if ingest.setup.is_empty() { "set-up not printed" } else { &ingest.setup }
    )?;
    writeln!(
        md,
        "| producers | traced | offered calls/s | achieved calls/s | calls | delivered | lost | delivered/s | reader CPU | reader ns/event | producer CPU µs/call |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for s in &ingest.steps {
        let offered = if s.offered == 0 { "unpaced".to_string() } else { s.offered.to_string() };
        let (delivered_per_s, reader, per_event) = if s.traced {
            (
                format!("{:.0}", s.delivered_per_s()),
                format!("{:.1} %", 100.0 * s.reader_cpu_s / s.secs),
                format!("{:.0}", 1e9 * s.reader_cpu_s / s.delivered.max(1) as f64),
            )
        } else {
            ("–".into(), "–".into(), "–".into())
        };
        writeln!(
            md,
            "| {} | {} | {offered} | {:.0} | {} | {} | {} | {delivered_per_s} | {reader} | {per_event} | {:.2} |",
            s.threads,
            if s.traced { "yes" } else { "no" },
            s.achieved,
            s.calls,
            s.delivered,
            s.lost,
            1e6 * s.producer_cpu_s / s.calls.max(1) as f64,
        )?;
    }
    let traced = || ingest.steps.iter().filter(|s| s.traced);
    let best = traced().filter(|s| s.lossless()).max_by(|a, b| a.delivered_per_s().total_cmp(&b.delivered_per_s()));
    let first_drop = traced().filter(|s| !s.lossless()).min_by(|a, b| a.achieved.total_cmp(&b.achieved));
    let top = traced().max_by(|a, b| a.achieved.total_cmp(&b.achieved));
    let best_rate = best.map_or(0.0, |s| s.delivered_per_s());
    let how = |s: &IngestStep| {
        let offered = if s.offered == 0 { "unpaced".to_string() } else { format!("offered {}", s.offered) };
        format!("{} producer thread{}, {offered}", s.threads, if s.threads == 1 { "" } else { "s" })
    };
    writeln!(
        md,
        "\nHighest sustained rate with 0 lost: {best_rate:.0} events/s{}. Drops start: {}.",
        best.map_or(String::new(), |s| format!(" ({})", how(s))),
        match (first_drop, top) {
            (Some(d), _) => format!(
                "at {:.0} calls/s achieved ({}; {} lost, {} not delivered)",
                d.achieved,
                how(d),
                d.lost,
                d.calls.saturating_sub(d.delivered)
            ),
            (None, Some(t)) =>
                format!("never, up to the highest rate the producers reached ({:.0} calls/s, {})", t.achieved, how(t)),
            (None, None) => "no traced step".into(),
        }
    )?;
    if !ingest.drain_per_s.is_empty() {
        let drain = median(&ingest.drain_per_s);
        writeln!(
            md,
            "The reader alone (producers fill ~80 % of the ring while it waits, then one drain, timed in the reader thread's CPU time; {} fills): median {drain:.0} events per CPU second, {:.0} ns per event decoded and recorded, its ceiling with a core to itself.",
            ingest.drain_per_s.len(),
            1e9 / drain
        )?;
    }
    if let Some(t) = top {
        let producer_us = 1e6 * t.producer_cpu_s / t.calls.max(1) as f64;
        let reader_us = 1e6 * t.reader_cpu_s / t.delivered.max(1) as f64;
        if first_drop.is_none() {
            write!(md, "No step lost an event, so the producers, not the reader, set the top rate. ")?;
        }
        write!(
            md,
            "At the top step each event cost {producer_us:.2} µs of producer CPU (the uprobe trap and the program, on the traced thread) plus {reader_us:.3} µs of reader CPU (decode and record), and the reader used {:.0} % of a core",
            100.0 * t.reader_cpu_s / t.secs
        )?;
        if ingest.cores > 0 {
            write!(
                md,
                "; at that cost {} cores allow at most {:.0} events/s",
                ingest.cores,
                f64::from(ingest.cores) * 1e6 / (producer_us + reader_us)
            )?;
        }
        writeln!(md, ".")?;
    }
    writeln!(md, "\n- Goal ≥ 2,000,000 events/s with 0 lost: {} ({best_rate:.0})\n", met(best_rate >= 2e6))?;
    Ok(())
}

pub fn ingest_csv(csv: &mut String, ingest: &Ingest) -> Result<()> {
    for s in &ingest.steps {
        let key = if s.traced { format!("traced_{}x{}", s.threads, s.offered) } else { "untraced".into() };
        writeln!(csv, "ingest_achieved_per_s,{key},,{}", s.achieved)?;
        writeln!(csv, "ingest_calls,{key},,{}", s.calls)?;
        writeln!(csv, "ingest_delivered,{key},,{}", s.delivered)?;
        writeln!(csv, "ingest_lost,{key},,{}", s.lost)?;
        writeln!(csv, "ingest_secs,{key},,{}", s.secs)?;
        writeln!(csv, "ingest_reader_cpu_s,{key},,{}", s.reader_cpu_s)?;
        writeln!(csv, "ingest_producer_cpu_s,{key},,{}", s.producer_cpu_s)?;
    }
    for (i, r) in ingest.drain_per_s.iter().enumerate() {
        writeln!(csv, "ingest_reader_alone_per_s,drain,{},{r}", i + 1)?;
    }
    Ok(())
}

pub fn profile_section(md: &mut String, ctx: &Ctx, profile: &Profile) -> Result<()> {
    writeln!(md, "## Profile of a traced run (B, `-t 2`)\n")?;
    writeln!(
        md,
        "One more B run with `kernel.bpf_stats_enabled=1`; BPF counters sampled with `bpftool prog show` while attached; \
         `perf stat -p` on the ttrace process (not the traced child). Generation: {}.\n",
        profile.tokens_per_s.map_or("?".into(), |t| format!("{t:.2} tokens/s"))
    )?;
    if profile.programs.is_empty() {
        writeln!(md, "No BPF program counters were captured.")?;
    } else {
        writeln!(md, "| program | run_cnt | run_time_ns | ns per run |")?;
        writeln!(md, "|---|---|---|---|")?;
        for (name, cnt, ns) in &profile.programs {
            writeln!(md, "| {name} | {cnt} | {ns} | {:.0} |", *ns as f64 / *cnt as f64)?;
        }
        // The per-token cost is the graph and marker probes'; page-fault and
        // I/O tracepoints fire mostly while the model loads.
        let per_token: u64 = profile
            .programs
            .iter()
            .filter(|p| ["graph_compute", "argsort", "call_", "ubatch"].iter().any(|k| p.0.starts_with(k)))
            .map(|p| p.2)
            .sum();
        if let Some(&(_, graphs, graph_ns)) = profile.programs.iter().find(|p| p.0 == "graph_compute") {
            writeln!(
                md,
                "\nKernel time: {:.1} µs per graph (`graph_compute`, {graphs} graphs, the first one's full walk \
                 included); {:.1} µs per generated token in the graph and marker probes ({} tokens).",
                graph_ns as f64 / graphs.max(1) as f64 / 1000.0,
                per_token as f64 / f64::from(ctx.tokens) / 1000.0,
                ctx.tokens
            )?;
        }
    }
    writeln!(md, "\nperf stat (ttrace process): {}\n", profile.perf_stat.as_deref().unwrap_or("not available"))?;
    Ok(())
}

pub fn profile_csv(csv: &mut String, profile: &Profile) -> Result<()> {
    for (name, cnt, ns) in &profile.programs {
        writeln!(csv, "profile_bpf_run_cnt,{name},,{cnt}")?;
        writeln!(csv, "profile_bpf_run_time_ns,{name},,{ns}")?;
    }
    Ok(())
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

    #[test]
    fn ingest_section_states_best_rate_and_drops() {
        let out = "# cores 2, ring 16777216 bytes\n\
                   step,0,1,0,468610700,937221632,0,0,2.000,0.000,2.000\n\
                   step,1,1,0,1007654,2015488,2015488,0,2.000,0.218,2.000\n\
                   step,1,2,0,1961793,3923968,3923968,0,2.000,0.322,3.658\n\
                   drain,2,152520,0.012460,0.012429,12271549,0\n";
        let mut md = String::new();
        ingest_section(&mut md, &parse_ingest(out).unwrap()).unwrap();
        if std::env::var_os("SHOW_MD").is_some() {
            println!("{md}");
        }
        assert!(
            md.contains("Highest sustained rate with 0 lost: 1961793 events/s (2 producer threads, unpaced)"),
            "{md}"
        );
        assert!(md.contains("Drops start: never"), "{md}");
        assert!(md.contains("Goal ≥ 2,000,000 events/s with 0 lost: **not met**"), "{md}");

        let lossy = format!("{out}step,1,3,0,2500000,5000000,4990000,10000,2.000,0.300,3.900\n");
        let mut md = String::new();
        ingest_section(&mut md, &parse_ingest(&lossy).unwrap()).unwrap();
        assert!(
            md.contains("Drops start: at 2500000 calls/s achieved (3 producer threads, unpaced; 10000 lost"),
            "{md}"
        );
    }
}
