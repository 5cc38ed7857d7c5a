//! `ttrace view` at scale: a trace of Gemma generating long with
//! `--all-threads` (op timing, a record per worker thread and op: ≥ 10 M
//! ops), served; the time until it answers, its peak RSS, and per query kind
//! the time a client waits (request sent to last byte, compressed as a
//! browser asks) over requests that pan and zoom as a front end would. First paint and frame times come with the front end.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Ctx, median};
use crate::shell;

/// Generated tokens: 511 ops each on Gemma 3 270M, twice with two threads,
/// so ≥ 10 M ops.
const TOKENS: u32 = 10_000;
const QUICK_TOKENS: u32 = 1_000;
/// Requests timed per query kind.
const REQUESTS: usize = 40;

pub struct Viewer {
    pub trace_bytes: u64,
    pub ops: u64,
    pub ubatches: u64,
    pub tokens: u32,
    /// From start until `/api/v1/meta` answered, and until the report
    /// document (`/api/v1/summary`) did.
    pub ready_s: f64,
    pub summary_s: f64,
    /// The first `/api/v1/simulate` (computed in the background from the
    /// first request on) until its answer, after the summary.
    pub simulate_s: f64,
    pub peak_rss_kib: u64,
    /// Per query kind: server times in ms.
    pub queries: Vec<(&'static str, Vec<f64>)>,
    /// The front end in headless Chromium (`scripts/bench/viewer_frames.py`).
    pub frames: Frames,
    /// The 1-minute load average when the server started: on 2 cores, other
    /// work stretches indexing several times.
    pub load: f64,
    /// The index on disk: the first open's save, and a second open mapping it.
    pub index: Reopened,
}

/// The first open's index file, and a second open that maps it.
pub struct Reopened {
    /// How long the first open took to write it, as its `ttrace: index
    /// saved to … (N MB, S s)` says (it is written in the background after
    /// the report, the sort orders and the op tracks).
    pub saved_s: f64,
    pub index_bytes: u64,
    pub ready_s: f64,
    pub peak_rss_kib: u64,
    /// Per query kind, as the first open's.
    pub queries: Vec<(&'static str, Vec<f64>)>,
}

/// First paint and, per gesture, frame intervals while real input arrives.
#[derive(serde::Deserialize)]
pub struct Frames {
    pub first_paint_ms: f64,
    pub memmap_zoom: Gesture,
    pub memmap_pan: Gesture,
    pub timeline_zoom: Gesture,
}

#[derive(serde::Deserialize)]
pub struct Gesture {
    pub frames: u32,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub fps: f64,
}

impl Frames {
    pub(super) fn gestures(&self) -> [(&'static str, &Gesture); 3] {
        [
            ("memory map zoom", &self.memmap_zoom),
            ("memory map pan", &self.memmap_pan),
            ("timeline zoom", &self.timeline_zoom),
        ]
    }
}

pub fn run(ctx: &Ctx, model: &Path) -> Result<Viewer> {
    let (trace, tokens) = long_trace(ctx, model)?;
    let mut v = measure(ctx, &trace)?;
    v.tokens = tokens;
    Ok(v)
}

/// The ≥ 10 M-op Gemma trace (1,000 tokens with --quick), recorded once and
/// kept in the bench's directory; `simulate` replays it too.
pub fn long_trace(ctx: &Ctx, model: &Path) -> Result<(std::path::PathBuf, u32)> {
    let tokens = if ctx.quick { QUICK_TOKENS } else { TOKENS };
    let trace = ctx.out_dir.join(format!("viewer-{tokens}.data"));
    if !trace.exists() {
        eprintln!("bench: recording {tokens} tokens of Gemma with --all-threads for the viewer (once)");
        let partial = trace.with_extension("partial");
        shell::run(
            Command::new(&ctx.ttrace)
                .args(["run", "--all-threads", "-o"])
                .arg(&partial)
                .arg("--")
                .arg(&ctx.paths.llama.completion)
                .arg("-m")
                .arg(model)
                .args(["-p", "Once upon a time", "-n", &tokens.to_string(), "-c", &(tokens + 64).to_string()])
                .args(["--ignore-eos", "-no-cnv", "-t", "2"])
                .stdout(Stdio::null()),
        )?;
        std::fs::rename(&partial, &trace)?;
    }
    Ok((trace, tokens))
}

/// Where `ttrace view` saves `trace`'s index: beside it (docs/VIEW_API.md §3).
pub(super) fn index_file(trace: &Path) -> std::path::PathBuf {
    let mut name = trace.as_os_str().to_owned();
    name.push(".ttidx");
    name.into()
}

/// `ttrace view TRACE` on any free port, its stderr to `log`; its address.
pub(super) fn serve(ctx: &Ctx, trace: &Path, log: &Path) -> Result<(super::stopper::StopOnDrop, String)> {
    let mut server = start(ctx, trace, log)?;
    let mut line = String::new();
    BufReader::new(server.child().stdout.take().context("stdout")?).read_line(&mut line)?;
    let Some(port) = line.split("127.0.0.1:").nth(1).and_then(|r| r.split('/').next()) else {
        bail!("ttrace view printed no URL: {line:?}");
    };
    Ok((server, format!("127.0.0.1:{port}")))
}

/// `ttrace view TRACE` started, its URL not yet read from its stdout.
pub(super) fn start(ctx: &Ctx, trace: &Path, log: &Path) -> Result<super::stopper::StopOnDrop> {
    let child = Command::new(&ctx.ttrace)
        .arg("view")
        .arg(trace)
        .args(["--port", "0", "--no-open"])
        // Its stages' times and RSS in the log (`analysed in`, `walked in`, …).
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("starting ttrace view")?;
    // Stopped as Ctrl-C stops it, also when a query below fails; it exits
    // within a second of it (docs/VIEW_API.md), even while computing.
    Ok(super::stopper::StopOnDrop::with_grace(child, Duration::from_secs(5)))
}

/// Serves `trace` with `ttrace`, times the server's queries, then the front
/// end; then opens it again, through the index the first open saved.
fn measure(ctx: &Ctx, trace: &Path) -> Result<Viewer> {
    let index_file = index_file(trace);
    // The first open is timed as one that finds no index.
    let _ = std::fs::remove_file(&index_file);
    let log = ctx.out_dir.join("viewer-view.log");
    let load = super::attach::load_average();
    let started = Instant::now();
    let (mut server, addr) = serve(ctx, trace, &log)?;
    let meta: serde_json::Value = serde_json::from_slice(&get(&addr, "/api/v1/meta", false)?.1)?;
    let ready_s = started.elapsed().as_secs_f64();
    get(&addr, "/api/v1/summary", true)?;
    let summary_s = started.elapsed().as_secs_f64();
    let simulating = Instant::now();
    get(&addr, "/api/v1/simulate", false)?;
    let simulate_s = simulating.elapsed().as_secs_f64();
    let result = queries(&addr, &meta);
    let frames = front_end(ctx, &addr);
    let peak_rss_kib = super::status_kib(server.id(), "VmHWM").unwrap_or(0);
    let saved_s = wait_saved(&mut server, &log, started)?;
    drop(server);
    let reopened = Instant::now();
    let (server, addr) = serve(ctx, trace, &log)?;
    get(&addr, "/api/v1/meta", false)?;
    let index = Reopened {
        saved_s,
        index_bytes: std::fs::metadata(&index_file)?.len(),
        ready_s: reopened.elapsed().as_secs_f64(),
        queries: queries(&addr, &meta)?,
        peak_rss_kib: super::status_kib(server.id(), "VmHWM").unwrap_or(0),
    };
    if !std::fs::read_to_string(&log)?.contains("reused") {
        bail!("the second ttrace view did not reuse {}", index_file.display());
    }
    drop(server);
    Ok(Viewer {
        trace_bytes: std::fs::metadata(trace)?.len(),
        ops: meta["counts"]["ops"].as_u64().unwrap_or(0),
        ubatches: meta["counts"]["ubatches"].as_u64().unwrap_or(0),
        tokens: 0,
        ready_s,
        summary_s,
        simulate_s,
        peak_rss_kib,
        queries: result?,
        frames: frames?,
        load,
        index,
    })
}

/// Waits for `server`'s `ttrace: index saved to … (N MB, S s)` line in
/// `log`: S, the time it took to write.
pub(super) fn wait_saved(server: &mut super::stopper::StopOnDrop, log: &Path, started: Instant) -> Result<f64> {
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.starts_with("ttrace: index saved to")) {
            let written = line.rsplit(", ").next().and_then(|t| t.split(' ').next()?.parse().ok());
            return written.with_context(|| format!("no write time in {line:?}"));
        }
        if text.contains("could not be saved") || started.elapsed() > COMPUTING_AT_MOST {
            bail!("ttrace view saved no index: {}", text.lines().last().unwrap_or(""));
        }
        if let Some(status) = server.child().try_wait()? {
            bail!("ttrace view exited ({status}) before saving its index");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// First paint and frame times of the embedded front end against the running server.
pub(super) fn front_end(ctx: &Ctx, addr: &str) -> Result<Frames> {
    let script = crate::cache::repo_root().join("scripts/bench/viewer_frames.py");
    let out = Command::new(&ctx.paths.venv_python)
        .arg(&script)
        .arg(format!("http://{addr}/"))
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("reading the output of {}", script.display()))
}

/// A small deterministic generator for the pans and zooms.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }

    /// A window of `span / 2^k` for a random k in 0..8, anywhere in `[0, span)`.
    fn window(&mut self, span: u64) -> (u64, u64) {
        let w = (span >> self.below(8)).max(1);
        let from = self.below(span - w + 1);
        (from, from + w)
    }
}

pub(super) fn queries(addr: &str, meta: &serde_json::Value) -> Result<Vec<(&'static str, Vec<f64>)>> {
    let n_ub = meta["counts"]["ubatches"].as_u64().unwrap_or(1).max(1);
    let dur = meta["trace"]["duration_ns"].as_u64().unwrap_or(1).max(1);
    let disk = meta["tracks"]["disk"]["size"].as_u64().unwrap_or(1).max(1);
    let n_tensors = meta["tensors"].as_array().map_or(1, |t| t.len() as u64).max(1);
    let tracks: serde_json::Value = serde_json::from_slice(&get(addr, "/api/v1/timeline/tracks", false)?.1)?;
    let ids = || tracks.as_array().into_iter().flatten().filter_map(|t| t["id"].as_str());
    let has_layers = ids().any(|id| id.starts_with("layer:"));
    let op_track = ids().find(|id| id.starts_with("ops:")).map_or_else(|| "ubatch".into(), str::to_string);
    let mut rng = Lcg(25);
    let (w, h) = (1600, 800);
    type Make<'a> = Box<dyn FnMut(&mut Lcg) -> String + 'a>;
    let kinds: Vec<(&'static str, Make)> = vec![
        ("meta", Box::new(|_| "/api/v1/meta".into())),
        ("ubatches", Box::new(|_| "/api/v1/ubatches".into())),
        (
            "memmap grid, ubatch × offset",
            Box::new(|r| {
                let ((x0, x1), (y0, y1)) = (r.window(n_ub), r.window(disk));
                format!(
                    "/api/v1/memmap/grid?track=disk&x=ubatch&x_from={x0}&x_to={x1}&y_from={y0}&y_to={y1}&w={w}&h={h}"
                )
            }),
        ),
        (
            "memmap grid, time × offset",
            Box::new(|r| {
                let ((x0, x1), (y0, y1)) = (r.window(dur), r.window(disk));
                format!("/api/v1/memmap/grid?track=disk&x=time&x_from={x0}&x_to={x1}&y_from={y0}&y_to={y1}&w={w}&h={h}")
            }),
        ),
        (
            "memmap grid, buffer track",
            Box::new(|r| {
                let (x0, x1) = r.window(n_ub);
                format!("/api/v1/memmap/grid?track=buffer&x=ubatch&x_from={x0}&x_to={x1}&w={w}&h={h}")
            }),
        ),
        (
            "memmap cell",
            Box::new(|r| {
                let u = r.below(n_ub);
                let y = r.below(disk);
                format!(
                    "/api/v1/memmap/cell?track=disk&x=ubatch&x_from={u}&x_to={}&y_from={y}&y_to={}",
                    u + 1,
                    y + 4096
                )
            }),
        ),
        (
            "token × tensor matrix",
            Box::new(|r| {
                let (x0, x1) = r.window(n_ub);
                format!("/api/v1/memmap/tensors?x=ubatch&x_from={x0}&x_to={x1}&w={w}")
            }),
        ),
        (
            "timeline ops slices",
            Box::new(|r| {
                let (t0, t1) = r.window(dur);
                format!("/api/v1/timeline/slices?track={op_track}&t_from={t0}&t_to={t1}&w={w}")
            }),
        ),
        // A trace without op timing has no layer tracks: its phase track then.
        if has_layers {
            (
                "timeline layer slices",
                Box::new(|r| {
                    let (t0, t1) = r.window(dur);
                    format!("/api/v1/timeline/slices?track=layer:{}&t_from={t0}&t_to={t1}&w={w}", r.below(4))
                }),
            )
        } else {
            (
                "timeline phase slices",
                Box::new(|r| {
                    let (t0, t1) = r.window(dur);
                    format!("/api/v1/timeline/slices?track=phase&t_from={t0}&t_to={t1}&w={w}")
                }),
            )
        },
        (
            "timeline counter",
            Box::new(|r| {
                let (t0, t1) = r.window(dur);
                format!("/api/v1/timeline/counter?track=counter:faults_minor&t_from={t0}&t_to={t1}&w={w}")
            }),
        ),
        ("op table page", Box::new(|r| format!("/api/v1/ops?offset={}&limit=100", r.below(1_000_000)))),
        ("op table, tensor filter", Box::new(|r| format!("/api/v1/ops?tensor={}&limit=100", r.below(n_tensors)))),
        (
            "op table, name regex + layer",
            Box::new(|r| format!("/api/v1/ops?name=attn_%5Bqk%5D&layer={}&limit=100", r.below(4))),
        ),
        (
            "op table, sorted by duration",
            Box::new(|r| format!("/api/v1/ops?sort=dur&desc=1&offset={}&limit=100", r.below(10_000))),
        ),
        (
            "op table, ubatch range",
            Box::new(|r| {
                let (a, b) = r.window(n_ub);
                format!("/api/v1/ops?from_ubatch={a}&to_ubatch={b}&phase=generate&limit=100")
            }),
        ),
        ("graph", Box::new(|r| format!("/api/v1/graph?ubatch={}", r.below(n_ub)))),
        ("tensor lookup", Box::new(|r| format!("/api/v1/tensor/{}", r.below(n_tensors)))),
    ];
    let mut out = Vec::new();
    for (kind, mut make) in kinds {
        let mut times = Vec::with_capacity(REQUESTS);
        for _ in 0..REQUESTS {
            let path = make(&mut rng);
            let (timing, _) = get(addr, &path, true).with_context(|| format!("GET {path}"))?;
            times.push(timing);
        }
        out.push((kind, times));
    }
    Ok(out)
}

/// `GET path`: the ms from sending it to the answer's last byte, and the
/// body (compressed when `compressed`, as a browser asks). A 202 (an
/// answer computed in the background, docs/VIEW_API.md) is asked again
/// until it is in.
pub(super) fn get(addr: &str, path: &str, compressed: bool) -> Result<(f64, Vec<u8>)> {
    get_until(addr, path, compressed, Instant::now() + COMPUTING_AT_MOST)
}

/// [`get`], asking again after a 202 only until `deadline`.
pub(super) fn get_until(addr: &str, path: &str, compressed: bool, deadline: Instant) -> Result<(f64, Vec<u8>)> {
    loop {
        let asked = Instant::now();
        let (head, body) = request(addr, path, compressed)?;
        let waited_ms = asked.elapsed().as_secs_f64() * 1e3;
        if head.starts_with("http/1.1 202") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        if !head.starts_with("http/1.1 200") {
            bail!("{}", head.lines().next().unwrap_or(""));
        }
        if head.contains("transfer-encoding: chunked") && !compressed {
            bail!("chunked answer: not expected from ttrace view");
        }
        return Ok((waited_ms, body));
    }
}

/// How long a background computation (the first simulation of the bench's
/// trace) may take.
const COMPUTING_AT_MOST: Duration = Duration::from_secs(3600);

/// One request: its head (lower case) and body.
fn request(addr: &str, path: &str, compressed: bool) -> Result<(String, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    let encoding = if compressed { "Accept-Encoding: gzip, deflate, br, zstd\r\n" } else { "" };
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{encoding}Connection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").context("no end of headers")?;
    Ok((String::from_utf8_lossy(&raw[..split]).to_lowercase(), raw[split + 4..].to_vec()))
}

pub(super) fn percentile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(f64::NAN)
}

pub fn csv(out: &mut String, v: &Viewer) -> std::fmt::Result {
    use std::fmt::Write as _;
    writeln!(out, "viewer_ready_s,,,{}", v.ready_s)?;
    writeln!(out, "viewer_summary_s,,,{}", v.summary_s)?;
    writeln!(out, "viewer_simulate_s,,,{}", v.simulate_s)?;
    writeln!(out, "viewer_peak_rss_kib,,,{}", v.peak_rss_kib)?;
    writeln!(out, "viewer_ops,,,{}", v.ops)?;
    writeln!(out, "viewer_load_average,,,{}", v.load)?;
    query_rows(out, "viewer_query_ms", &v.queries)?;
    writeln!(out, "viewer_index_saved_s,,,{}", v.index.saved_s)?;
    writeln!(out, "viewer_index_bytes,,,{}", v.index.index_bytes)?;
    writeln!(out, "viewer_reopen_ready_s,,,{}", v.index.ready_s)?;
    writeln!(out, "viewer_reopen_peak_rss_kib,,,{}", v.index.peak_rss_kib)?;
    query_rows(out, "viewer_reopen_query_ms", &v.index.queries)?;
    writeln!(out, "viewer_first_paint_ms,,,{}", v.frames.first_paint_ms)?;
    for (name, g) in v.frames.gestures() {
        let key = name.replace(' ', "_");
        writeln!(out, "viewer_fps,{key},,{}", g.fps)?;
        writeln!(out, "viewer_frame_p95_ms,{key},,{}", g.p95_ms)?;
    }
    Ok(())
}

/// Per query kind: p50, p95 and max of the client's waits, then a blank
/// line; the worst p95.
pub(super) fn query_table(
    md: &mut String,
    first_column: &str,
    queries: &[(&'static str, Vec<f64>)],
) -> Result<f64, std::fmt::Error> {
    use std::fmt::Write as _;
    writeln!(md, "| {first_column} | p50 ms | p95 ms | max ms |")?;
    writeln!(md, "|---|---|---|---|")?;
    let mut worst: f64 = 0.0;
    for (kind, times) in queries {
        let p95 = percentile(times, 0.95);
        worst = worst.max(p95);
        writeln!(md, "| {kind} | {:.2} | {p95:.2} | {:.2} |", median(times), percentile(times, 1.0))?;
    }
    writeln!(md)?;
    Ok(worst)
}

/// Each query's time as a CSV row under `key`.
pub(super) fn query_rows(out: &mut String, key: &str, queries: &[(&'static str, Vec<f64>)]) -> std::fmt::Result {
    use std::fmt::Write as _;
    for (kind, times) in queries {
        for (i, t) in times.iter().enumerate() {
            writeln!(out, "{key},{kind},{},{t}", i + 1)?;
        }
    }
    Ok(())
}

pub fn section(md: &mut String, v: &Viewer) -> std::fmt::Result {
    use std::fmt::Write as _;
    let met = |ok: bool| if ok { "**met**" } else { "**not met**" };
    writeln!(md, "\n## Viewer (`ttrace view`)\n")?;
    writeln!(
        md,
        "A trace of `llama-completion -t 2` on the real model with `--all-threads` (op timing, a record per thread \
         and op), {} generated tokens: {} ops, {} ubatches, \
         {:.1} MB. `ttrace view` is started on it; ready = until `/api/v1/meta` answers (the trace read and indexed), \
         summary = until `/api/v1/summary` (`ttrace report --json`'s document, built in a second thread) does, simulate = from the first \
         `/api/v1/simulate` until its answer (`ttrace simulate`'s curve, computed in the background meanwhile, asked \
         again every 200 ms). Then \
         {REQUESTS} requests per query kind that pan and zoom (windows of 1/2^k of the run and of the model, k < 8; \
         1600×800 px), each timed as its client waits: from the request sent to the answer's last byte, compressed as a \
         browser asks (`Accept-Encoding: gzip, deflate, br, zstd`).\n",
        v.tokens,
        v.ops,
        v.ubatches,
        v.trace_bytes as f64 / 1e6
    )?;
    writeln!(
        md,
        "- ready {:.2} s; summary {:.2} s; simulate {:.2} s; peak RSS {:.0} MiB; load average (1 min) {:.1} at the \
         start\n",
        v.ready_s,
        v.summary_s,
        v.simulate_s,
        v.peak_rss_kib as f64 / 1024.0,
        v.load
    )?;
    let worst = query_table(md, "query", &v.queries)?;
    writeln!(md, "- Goal ≥ 10 M ops in the trace: {} ({})", met(v.ops >= 10_000_000), v.ops)?;
    writeln!(md, "- Goal ready ≤ 5 s: {} ({:.2} s)", met(v.ready_s <= 5.0), v.ready_s)?;
    writeln!(
        md,
        "- Goal peak RSS ≤ 1.5 GB: {} ({:.2} GB)",
        met(v.peak_rss_kib * 1024 <= 1_500_000_000),
        v.peak_rss_kib as f64 * 1024.0 / 1e9
    )?;
    writeln!(md, "- Goal every query kind p95 ≤ 100 ms: {} (worst {worst:.1} ms)", met(worst <= 100.0))?;
    let r = &v.index;
    writeln!(
        md,
        "\nThe index on disk (docs/VIEW_API.md §3): the first open wrote `TRACE.ttidx` ({:.0} MB) in {:.1} s (in \
         the background, after the report, the sort orders and the op tracks); a second open mapped it: ready {:.2} s, \
         peak RSS {:.0} MiB (the analysis is in the index too; the report's pass reads the trace in the \
         background). The same requests against it:\n",
        r.index_bytes as f64 / 1e6,
        r.saved_s,
        r.ready_s,
        r.peak_rss_kib as f64 / 1024.0
    )?;
    let reopened_worst = query_table(md, "query (second open)", &r.queries)?;
    writeln!(md, "- Goal second open ready ≤ 2 s: {} ({:.2} s)", met(r.ready_s <= 2.0), r.ready_s)?;
    writeln!(
        md,
        "- Goal second open every query kind p95 ≤ 100 ms: {} (worst {reopened_worst:.1} ms)",
        met(reopened_worst <= 100.0)
    )?;
    writeln!(
        md,
        "\nThe embedded front end in Debian's headless Chromium (`scripts/bench/viewer_frames.py`, 1600×1000, \
         software rendering): first paint = navigation start to the memory map's first drawn answer; frame times \
         = intervals between animation frames while real wheel or drag input arrives.\n"
    )?;
    writeln!(md, "| gesture | frames | p50 ms | p95 ms | fps |")?;
    writeln!(md, "|---|---|---|---|---|")?;
    let mut slowest = f64::INFINITY;
    for (name, g) in v.frames.gestures() {
        slowest = slowest.min(g.fps);
        writeln!(md, "| {name} | {} | {:.1} | {:.1} | {:.1} |", g.frames, g.p50_ms, g.p95_ms, g.fps)?;
    }
    writeln!(md)?;
    writeln!(md, "- First paint: {:.0} ms", v.frames.first_paint_ms)?;
    writeln!(md, "- Goal ≥ 30 fps while zooming and panning: {} (slowest {slowest:.1} fps)", met(slowest >= 30.0))?;
    super::thesis_webui::section(md)
}
