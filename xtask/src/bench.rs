//! `cargo xtask bench`: inference overhead, ingest throughput, trace size,
//! export speed and a profile of a traced run, written to
//! `docs/BENCHMARKS.md` with the raw numbers in `docs/benchmarks.csv`.

mod overhead;
mod parts;
mod server;
mod viewer;

use std::{fmt::Write as _, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail};

use crate::{cache, demo, setup, shell};

pub struct Ctx {
    pub paths: setup::Paths,
    pub ttrace: PathBuf,
    pub out_dir: PathBuf,
    pub flushlog: PathBuf,
    pub rounds: usize,
    pub tokens: u32,
    pub quick: bool,
}

const FLUSH_LOG_C: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
__attribute__((destructor)) static void ttrace_flush_common_log(void) {
    void *(*log_main)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "_Z15common_log_mainv");
    void (*log_pause)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "_Z16common_log_pauseP10common_log");
    if (log_main && log_pause) log_pause(log_main());
}
"#;

/// llama.cpp's async logger loses the last lines (the perf print) in about
/// half the runs; this LD_PRELOAD library drains it at exit.
fn build_flushlog(cache: &std::path::Path) -> Result<PathBuf> {
    let dir = cache.join("bench");
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("flushlog.c");
    let so = dir.join("flushlog.so");
    std::fs::write(&src, FLUSH_LOG_C)?;
    shell::run(Command::new("cc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&so).arg(&src).arg("-ldl"))?;
    Ok(so)
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

fn cmd_line(cmd: &mut Command) -> String {
    shell::output(cmd).map(|s| s.lines().next().unwrap_or("").trim().to_string()).unwrap_or_else(|e| format!("? ({e})"))
}

fn met(ok: bool) -> &'static str {
    if ok { "**met**" } else { "**not met**" }
}

pub fn run(rounds: usize, quick: bool, server_only: bool) -> Result<()> {
    if !shell::is_root() {
        bail!("`cargo xtask bench` loads eBPF programs and needs root: run it with sudo");
    }
    let paths = setup::run_quiet()?;
    let ttrace = demo::build_ttrace()?;
    let root = cache::repo_root();
    let out_dir = root.join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    let flushlog = build_flushlog(&paths.cache)?;
    let rounds = if quick { rounds.min(3) } else { rounds };
    // 256 tokens: about 4 s of generation per run on 2 cores, long enough
    // that a scheduling hiccup of the machine does not decide a round.
    let tokens = if quick { 16 } else { 256 };
    let ctx = Ctx { paths, ttrace, out_dir, flushlog, rounds, tokens, quick };
    let model = ctx.paths.models.get("gemma").context("set-up fetched no `gemma` model")?.clone();
    if server_only {
        return server_part_only(&ctx, &model, &root);
    }

    let samples = overhead::run(&ctx, &model)?;
    eprintln!("bench: llama-server under {} concurrent clients", server::CLIENTS);
    let served = server::run(&ctx, &model)?;
    eprintln!("bench: profile of one traced run");
    let profile = parts::profile(&ctx, &model)?;
    eprintln!("bench: ingest throughput");
    let ingest = parts::ingest(&ctx)?;
    let summary =
        samples.iter().rev().find_map(|s| (s.variant == "B" && s.threads == 2).then(|| s.summary.clone()).flatten());
    let size = summary.as_deref().map(|s| parts::size(&ctx, s, &ctx.out_dir.join("overhead-B.data"))).transpose()?;
    eprintln!("bench: export speed");
    let export = parts::export(&ctx)?;
    eprintln!("bench: viewer");
    let viewer = viewer::run(&ctx, &model)?;

    let mut csv = String::from("part,key,round,value\n");
    for s in &samples {
        writeln!(csv, "overhead_tokens_per_s,{}-t{},{},{}", s.variant, s.threads, s.round, s.tokens_per_s)?;
    }
    for s in &served {
        writeln!(csv, "server_requests_per_s,{},{},{}", s.variant, s.round, s.requests_per_s)?;
    }
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
    if let Some(z) = &size {
        writeln!(csv, "size_bytes_per_op_frame,B,,{}", z.op_frame)?;
        writeln!(csv, "size_bytes_per_op_frame_with_desc,B,,{}", z.op_frame_with_desc)?;
        writeln!(csv, "size_file_bytes,B,,{}", z.file_bytes)?;
        writeln!(csv, "size_ops,B,,{}", z.ops)?;
        writeln!(csv, "size_io_records,B,,{}", z.io_records)?;
    }
    let (export_trace_bytes, exports) = &export;
    for e in exports {
        for (i, s) in e.secs.iter().enumerate() {
            writeln!(csv, "export_secs,{},{},{}", e.format, i + 1, s)?;
        }
        writeln!(csv, "export_events,{},,{}", e.format, e.events)?;
    }
    for (name, cnt, ns) in &profile.programs {
        writeln!(csv, "profile_bpf_run_cnt,{name},,{cnt}")?;
        writeln!(csv, "profile_bpf_run_time_ns,{name},,{ns}")?;
    }
    viewer::csv(&mut csv, &viewer)?;
    std::fs::create_dir_all(root.join("docs"))?;
    std::fs::write(root.join("docs/benchmarks.csv"), csv)?;

    let mut md = render(&ctx, &samples, &profile, &ingest, size.as_ref(), *export_trace_bytes, exports)?;
    server_section(&mut md, &ctx, &served)?;
    viewer::section(&mut md, &viewer)?;
    std::fs::write(root.join("docs/BENCHMARKS.md"), md)?;
    println!("bench: wrote docs/BENCHMARKS.md and docs/benchmarks.csv");
    Ok(())
}

/// `--server-only`: measure the server part and put its section in place
/// of the old one (or at the end) of docs/BENCHMARKS.md.
fn server_part_only(ctx: &Ctx, model: &std::path::Path, root: &std::path::Path) -> Result<()> {
    let served = server::run(ctx, model)?;
    let mut section = String::new();
    server_section(&mut section, ctx, &served)?;
    let path = root.join("docs/BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let heading = "\n## llama-server under";
    let new = match old.find(heading) {
        Some(start) => {
            let rest = &old[start + heading.len()..];
            let end = rest.find("\n## ").map_or(old.len(), |e| start + heading.len() + e);
            format!("{}{}{}", &old[..start], section, &old[end..])
        }
        None => format!("{old}{section}"),
    };
    std::fs::write(&path, new)?;
    println!("bench: wrote the llama-server section of docs/BENCHMARKS.md");
    Ok(())
}

fn server_section(md: &mut String, ctx: &Ctx, served: &[server::ServerSample]) -> Result<()> {
    writeln!(md, "\n## llama-server under {} concurrent clients\n", server::CLIENTS)?;
    writeln!(
        md,
        "`llama-server -np {clients} -c 4096 -t 2` on the real model, loopback; per round, after one warm-up wave, {waves} waves \
         of {clients} concurrent `/completion` requests (curl; `n_predict` {n}, `ignore_eos`, `cache_prompt` false) are \
         timed. {} interleaved rounds (A B, then B A, …). Figure: requests per second of wall time.\n",
        ctx.rounds,
        clients = server::CLIENTS,
        waves = server::WAVES,
        n = server::N_PREDICT,
    )?;
    let by = |v: &str| served.iter().filter(|s| s.variant == v).map(|s| s.requests_per_s).collect::<Vec<_>>();
    let get = |r: usize, v: &str| served.iter().find(|s| s.round == r && s.variant == v).map(|s| s.requests_per_s);
    let ratios: Vec<f64> = (1..=ctx.rounds).filter_map(|r| Some(get(r, "B")? / get(r, "A")?)).collect();
    writeln!(md, "| run | setup | median requests/s | min–max |")?;
    writeln!(md, "|---|---|---|---|")?;
    for (v, what) in [("A", "untraced"), ("B", "ttrace run (graph capture, sequences)")] {
        let xs = by(v);
        let (lo, hi) = min_max(&xs);
        writeln!(md, "| {v} | {what} | {:.3} | {lo:.3}–{hi:.3} |", median(&xs))?;
    }
    let (lo, hi) = min_max(&ratios);
    writeln!(
        md,
        "\n- Traced/untraced request throughput, median of per-round ratios: {:.3} ({lo:.3}–{hi:.3})\n",
        median(&ratios)
    )?;
    Ok(())
}

fn render(
    ctx: &Ctx,
    samples: &[overhead::Sample],
    profile: &parts::Profile,
    ingest: &parts::Ingest,
    size: Option<&parts::Size>,
    export_trace_bytes: u64,
    exports: &[parts::Export],
) -> Result<String> {
    let mut md = String::new();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = cmd_line(Command::new("sh").args(["-c", "free -g | awk '/Mem:/{print $2\" GiB\"}'"]));
    writeln!(md, "# Benchmarks\n")?;
    writeln!(
        md,
        "Generated by `cargo xtask bench{}` on {}.",
        if ctx.quick { " --quick" } else { "" },
        cmd_line(Command::new("date").arg("-u"))
    )?;
    writeln!(
        md,
        "Raw numbers: [benchmarks.csv](benchmarks.csv). Regenerate with `sudo -E cargo xtask bench [--rounds N] [--quick]`.\n"
    )?;
    writeln!(md, "## Machine and versions\n")?;
    writeln!(md, "- CPU: {cpu}, {} cores; memory {mem}", std::thread::available_parallelism().map_or(0, |n| n.get()))?;
    writeln!(md, "- kernel {}", cmd_line(Command::new("uname").arg("-r")))?;
    writeln!(md, "- llama.cpp commit {}; ttrace {}", ctx.paths.llama.commit, env!("CARGO_PKG_VERSION"))?;
    writeln!(
        md,
        "- {}; {}",
        cmd_line(Command::new("bpftrace").arg("--version")),
        cmd_line(Command::new("rustc").arg("--version"))
    )?;
    writeln!(md, "- The machine is shared and noisy: runs are interleaved and medians reported with min–max.\n")?;

    // Overhead.
    writeln!(md, "## Inference overhead\n")?;
    writeln!(
        md,
        "`llama-completion` on the real model (Gemma 3 270M Q4_K_M), prompt \"{}\", `-n {} -c 512 --ignore-eos`, warm \
         page cache (one untraced warm-up run first), {} interleaved rounds per thread count (A B C D, then rotated: B C D A, …). Figure: llama's \
         own generation speed (`eval time … tokens per second`), log drained by an LD_PRELOAD flush at exit.\n",
        overhead::PROMPT,
        ctx.tokens,
        ctx.rounds
    )?;
    for threads in overhead::THREADS {
        let by = |v: &str| {
            samples
                .iter()
                .filter(|s| s.variant == v && s.threads == threads)
                .map(|s| s.tokens_per_s)
                .collect::<Vec<_>>()
        };
        // Per-round ratios (each round's X over the same round's A) are less noise-prone.
        let per_round = |v: &str| {
            let get = |r: usize, w: &str| {
                samples.iter().find(|s| s.threads == threads && s.round == r && s.variant == w).map(|s| s.tokens_per_s)
            };
            median(&(1..=ctx.rounds).filter_map(|r| Some(get(r, v)? / get(r, "A")?)).collect::<Vec<_>>())
        };
        writeln!(md, "### `-t {threads}`\n")?;
        writeln!(md, "| run | setup | median tokens/s | min–max | median of per-round ratios to A |")?;
        writeln!(md, "|---|---|---|---|---|")?;
        for (v, what) in overhead::VARIANTS {
            let xs = by(v);
            let (lo, hi) = min_max(&xs);
            writeln!(md, "| {v} | {what} | {:.2} | {lo:.2}–{hi:.2} | {:.3} |", median(&xs), per_round(v))?;
        }
        let b = per_round("B");
        writeln!(md, "\n- Goal B/A ≥ 0.99 at `-t {threads}`: {} ({b:.3})\n", met(b >= 0.99))?;
    }

    // Ingest.
    ingest_section(&mut md, ingest)?;

    // Size.
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

    // Export.
    writeln!(md, "## Export speed\n")?;
    let events = exports.first().map_or(0, |e| e.events);
    writeln!(
        md,
        "Source: `ttrace run --all-threads` of llama-completion on the `tiny` model, `-n {}`; {events} events, {export_trace_bytes} bytes. Median of 3 interleaved runs per format; events/s = events / wall time of the whole `ttrace export` process.{}\n",
        if ctx.quick { 1000 } else { 7000 },
        if events < 1_000_000 { " **Below the 1 M events the method asks for (quick run).**" } else { "" }
    )?;
    writeln!(md, "| format | median s | min–max s | events/s | peak RSS |")?;
    writeln!(md, "|---|---|---|---|---|")?;
    let mut all_fast = true;
    for e in exports {
        let m = parts::median_secs(e);
        let (lo, hi) = min_max(&e.secs);
        let rate = e.events as f64 / m;
        if e.format != "perfetto" {
            all_fast &= rate >= 2e6;
        }
        let rss = e.max_rss_kb.map_or("?".into(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
        writeln!(md, "| {} | {m:.3} | {lo:.3}–{hi:.3} | {rate:.0} | {rss} |", e.format)?;
    }
    writeln!(md, "\n- Goal ≥ 2,000,000 events/s for jsonl/csv/parquet: {}\n", met(all_fast))?;

    // Profile.
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
    // Read at run time, so the analysis can be revised without a rebuild.
    let analysis = cache::repo_root().join("xtask/src/bench/analysis.md");
    writeln!(md, "{}", std::fs::read_to_string(&analysis).unwrap_or_default().trim())?;
    Ok(md)
}

fn ingest_section(md: &mut String, ingest: &parts::Ingest) -> Result<()> {
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
    let how = |s: &parts::IngestStep| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingest_section_states_best_rate_and_drops() {
        let out = "# cores 2, ring 16777216 bytes\n\
                   step,0,1,0,468610700,937221632,0,0,2.000,0.000,2.000\n\
                   step,1,1,0,1007654,2015488,2015488,0,2.000,0.218,2.000\n\
                   step,1,2,0,1961793,3923968,3923968,0,2.000,0.322,3.658\n\
                   drain,2,152520,0.012460,0.012429,12271549,0\n";
        let mut md = String::new();
        ingest_section(&mut md, &parts::parse_ingest(out).unwrap()).unwrap();
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
        ingest_section(&mut md, &parts::parse_ingest(&lossy).unwrap()).unwrap();
        assert!(
            md.contains("Drops start: at 2500000 calls/s achieved (3 producer threads, unpaced; 10000 lost"),
            "{md}"
        );
    }
}
