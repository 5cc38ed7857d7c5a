//! Command-line definition. Parsing only; `main.rs` dispatches.

use clap::{Args, Parser, Subcommand};

/// `-V`: the crate version and the commit it was built from (build.rs).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TTRACE_GIT_COMMIT"), ")");
/// `--version`: also the embedded eBPF object's hash, which tells two builds
/// of one commit apart (another nightly or bpf-linker makes other programs).
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TTRACE_GIT_COMMIT"),
    ", eBPF object ",
    env!("TTRACE_EBPF_OBJECT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "ttrace",
    version = VERSION,
    long_version = LONG_VERSION,
    about = "Trace which tensors a llama.cpp process touches, and the I/O they cause",
    long_about = "ttrace attaches eBPF probes to ggml's CPU backend and to the kernel's page-fault, \
page-cache and block-I/O tracepoints, and ties each tensor access to the disk reads it causes.\n\n\
Tracing needs root: run it with sudo on a normal machine.",
    after_help = "Examples:\n  \
sudo ttrace run -- llama-completion -m model.gguf -p \"hello\" -n 32 -no-cnv   trace a run\n  \
sudo ttrace run --drop-caches --mem-limit 512M -- llama-completion -m big.gguf -p hi -n 8\n  \
sudo ttrace attach --pid 4242 --duration 10                   trace a running process\n  \
ttrace report ttrace.data                                    what was read, per token and layer\n  \
ttrace export ttrace.data --format perfetto -o run.pftrace   timeline for ui.perfetto.dev\n  \
ttrace view ttrace.data                                      look at it in a browser\n  \
ttrace gguf model.gguf --extents                             the model's tensors on disk\n  \
sudo ttrace check                                            can this kernel run ttrace?"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); also honours RUST_LOG.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command under tracing: it starts held before exec, the probes
    /// attach to its ggml/llama libraries, then it runs. Writes the trace
    /// (default ./ttrace.data) and prints a summary on stderr.
    #[command(after_help = "Examples:\n  \
sudo ttrace run -- llama-completion -m model.gguf -p \"hello world\" -n 32 -no-cnv\n  \
sudo ttrace run -o moe.data --all-threads -- llama-completion -m moe.gguf -p hi -n 8\n  \
sudo ttrace run --lib ./build/bin/libggml-cpu.so -- python3 client.py\n  \
sudo ttrace run -o served.data --max-size 100M --max-files 10 -- llama-server -m model.gguf\n    \
(a ring: served.data.0000, .0001, …, the newest 10 kept; `ttrace report served.data` reads them as one run)\n\n\
The command runs as the user who invoked sudo (or --user), never as root unless asked.")]
    #[cfg(feature = "live")]
    Run(RunArgs),
    /// Attach to a running process and trace it until it exits, Ctrl-C,
    /// SIGTERM or --duration; detaching leaves it running.
    #[command(
        after_help = "Examples:\n  sudo ttrace attach --pid 4242\n  sudo ttrace attach --pid 4242 --duration 10 -o decode.data\n  \
sudo ttrace attach --pid 4242 -o served.data --max-size 1G --max-files 24   (a ring of files, see run --help)"
    )]
    #[cfg(feature = "live")]
    Attach(AttachArgs),
    /// A live view of a running llama.cpp (or of a command it starts): tokens/s
    /// per sequence, weight bytes/s per layer and component, disk bytes/s and
    /// faults/s tied to tensors, the top tensors, an expert × layer heat grid
    /// for MoE, the model's page-cache residency (cachestat) and the memory
    /// cgroup against its limit. Refreshes every --interval; keys: tab (or
    /// 1-5) switches panes, s sorts, p pauses, q quits. Leaving detaches from
    /// --pid (it keeps running) and stops a command top started (SIGINT).
    #[command(after_help = "Examples:\n  \
sudo ttrace top --pid $(pgrep llama-server)\n  \
sudo ttrace top -o served.data -- llama-server -m model.gguf -np 4\n  \
sudo ttrace top --json --interval 0.5 --pid 4242 | jq .tokens_per_s\n  \
sudo ttrace top --once --pid 4242\n\n\
--json prints one object per interval (keys t, interval_s, tokens_per_s, prompt, generated, \
disk_bytes, disk_bytes_per_s, faults_per_s, resident_bytes, model_bytes, top_tensors, layers, \
components, sequences, experts, memory, …), the first at t 0 as top starts; --once prints one \
full interval and exits. `memory` is the command's cgroup against --mem-limit, or with --pid the \
nearest cgroup above the process that limits memory (a systemd MemoryMax, a `ttrace run --mem-limit`).")]
    #[cfg(feature = "live")]
    Top(TopArgs),
    /// Summarise a trace: run metadata, ubatches per phase, ops, weights
    /// touched, lost events; MoE routing (activations, co-activation,
    /// stickiness, per-expert disk reads) and loaded vs used (bytes brought
    /// into the page cache, read from disk and read by some op, per tensor,
    /// expert, layer and phase). Needs no root.
    ///
    /// Weight bytes per token (per generated token, and per tensor, layer and
    /// component: `stats.*.bytes_per_token` in --json, the mean of
    /// `generate_weight_bytes`) charge each tensor once per ubatch with the
    /// most one of its ops read: the rows a GET_ROWS looked up, the routed
    /// experts' slices of an MoE expert tensor, else the view read. The tables
    /// sum to the generate ubatches' `weight_bytes`. `*` (`upper_bound`) marks
    /// figures that count an expert tensor whole: its routing was not recorded.
    #[command(
        after_help = "Examples:\n  ttrace report ttrace.data\n  ttrace report ttrace.data --json | jq '.ubatches[0]'\n  \
ttrace report moe.data --json | jq '.stats.moe.layers[0].phases'\n  \
ttrace report ttrace.data --json | jq '.stats.loaded_vs_used.total'\n  ttrace report ttrace.data --html report.html"
    )]
    Report(ReportArgs),
    /// Export a trace for other tools: Perfetto, Chrome JSON, JSONL/CSV/Parquet
    /// rows, per-token JSON for the thesis web UI, one ubatch's graph,
    /// blkparse text annotated with tensors, or MoE routing for mbolt. Needs
    /// no root.
    #[command(after_help = export_help())]
    Export(ExportArgs),
    /// Compare two runs of the same weights (e.g. before and after a layout
    /// rewrite): tokens and where they first diverge, MoE routing (under an
    /// expert permutation) up to that token, weight and disk bytes and faults
    /// per token and per layer, tensors and experts that moved between hot and
    /// cold. Exit status: 0 same tokens and routing, 1 they differ, 2 error.
    /// Needs no root.
    #[command(after_help = "Examples:\n  ttrace diff before.data after.data\n  \
ttrace diff before.data after.data --perm perms.json          (mbolt-sim cluster's output)\n  \
ttrace diff before.data after.data --json | jq .runs\n  \
ttrace diff before.data after.data --json | jq .first_divergence   (null: same tokens)\n  \
ttrace diff before.data after.data --html diff.html")]
    Diff(DiffArgs),
    /// Look at a trace interactively in a browser: a local web server with
    /// the memory map (which bytes of the model were read, when, from disk
    /// or not), timeline, op table, graph and MoE views, all linked. It
    /// prints the URL to open. Needs no root.
    #[command(after_help = "Examples:\n  \
ttrace view                                   ttrace.data on http://127.0.0.1:7575/\n  \
ttrace view run.data --port 0                 any free port\n  \
ttrace view run.data --no-open                print the URL only, open no browser\n  \
ssh -L 7575:127.0.0.1:7575 server 'ttrace view run.data --no-open'   from a headless server\n  \
ttrace view run.data --host 0.0.0.0           on the network: the URL carries a random token\n\n\
The page is built into ttrace (from viewer/, by `cargo xtask setup`); its HTTP API is in docs/VIEW_API.md.\n\
Ctrl-C stops the server.")]
    View(ViewArgs),
    /// Check that this machine can run ttrace: load the probes, uprobe a
    /// function in ttrace itself, trace page faults, and compare what arrives
    /// with what was done.
    #[command(after_help = "Examples:\n  sudo ttrace check\n  sudo ttrace check --calls 100000 --pages 256")]
    #[cfg(feature = "live")]
    Check(CheckArgs),
    /// List a GGUF model's tensors: file offset, size, layer, component, type
    /// and shape, then a summary. Reads the file only; needs no root.
    #[command(
        after_help = "Examples:\n  ttrace gguf model.gguf\n  ttrace gguf model.gguf --format csv > tensors.csv\n  \
ttrace gguf model-00001-of-00003.gguf --format json --full\n  ttrace gguf model.gguf --extents"
    )]
    Gguf(GgufArgs),
    /// Replay a trace's model-file reads under page-cache budgets: disk bytes
    /// per generated token for every budget at once (LRU, from stack
    /// distances), Belady's optimum (the floor no policy beats) and a model
    /// of the kernel's active/inactive lists; also under another expert
    /// layout (mbolt's perms.json) or readahead size. Needs no root.
    #[command(after_help = "Examples:\n  \
ttrace simulate ttrace.data\n  \
ttrace simulate run.data --budgets 160M,200M,256M --policy lru,opt\n  \
ttrace simulate run.data --budget-range 64M..1G --plot curve.svg --csv curve.csv\n  \
ttrace simulate moe.data --budgets 32M --layout perms.json      (mbolt's chain layout)\n  \
ttrace simulate run.data --readahead 256K --anon 40M --json\n\n\
A budget is a memory limit as `run --mem-limit` takes it: anonymous memory inside it (KV cache, compute and \
repacked weights) is taken off before the model's pages (--anon). Figures count generation (--phase all: everything \
from loading on) and are divided by the generated tokens.")]
    Simulate(SimulateArgs),
    /// Run a plan of models × prompts × settings, each traced as `ttrace run`
    /// traces it, into one Parquet dataset in hive layout (DIR/dataset:
    /// runs, ubatches, tokens, tensors, routing, io, and with --ops every event's row)
    /// that DuckDB and Spark read as it is; `ttrace sweep report DIR`
    /// compares the runs. Ctrl-C stops it; the same command resumes, skipping
    /// the finished runs. A failed run is recorded with its error and the
    /// sweep goes on. Needs root, like `run`.
    #[command(after_help = sweep::SWEEP_HELP, args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Sweep(SweepArgs),
}

/// `ttrace export --help`'s text after the options: examples, the row
/// columns (from the one column table) and the tokens-json layout.
fn export_help() -> String {
    let examples = "Examples:\n  \
ttrace export ttrace.data --format perfetto -o run.pftrace     (open in ui.perfetto.dev)\n  \
ttrace export ttrace.data --format parquet -o events.parquet\n  \
ttrace export ttrace.data --format tokens-json -o tokens/\n  \
ttrace export ttrace.data --format dot --ubatch 3 -o graph.dot && dot -Tsvg graph.dot > graph.svg\n  \
ttrace export moe.data --format mbolt -o routing.mblt && mbolt-sim cluster routing.mblt -o perms.json --min-tokens 1\n\n\
";
    let tokens = "tokens-json: the thesis web UI's data directory (copy it to the UI's public/data/): \
traces/token-NNNNN.json (the ubatch's op records) and graphs/token-NNNNN.json (the graph it executed) per generated \
token (generate-phase ubatch, in order), traces/ and graphs/prompt-NNNNN.json per prompt ubatch (the UI opens \
token-* only), memory-map.json with the model's tensor table, MoE expert tensors as one entry per expert \
(NAME[E]), buffer-timeline.json with ggml's backend buffers (when traced); warm-up graphs are not written.";
    format!("{examples}{}\n{tokens}", crate::export::columns::help())
}

#[cfg(feature = "live")]
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Calls made to the probed function.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub calls: u64,
    /// Fresh file-backed pages written (one page fault each).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(0..=65_536))]
    pub pages: u64,
    /// The page-fault tracepoint's flavour, as `run --tracepoints`.
    #[cfg(feature = "live")]
    #[arg(long, value_enum, default_value_t = TracepointChoice::Auto, value_name = "KIND")]
    pub tracepoints: TracepointChoice,
}

#[cfg(feature = "live")]
fn values_regex(text: &str) -> Result<regex_lite::Regex, String> {
    regex_lite::Regex::new(text).map_err(|e| format!("not a regular expression: {e}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GgufFormat {
    Table,
    Csv,
    Json,
}

#[derive(Debug, Args)]
pub struct GgufArgs {
    /// The model; any shard of a split model (NAME-0000i-of-0000N.gguf) opens all shards.
    pub model: std::path::PathBuf,
    /// Output format. CSV writes the summary to stderr so stdout stays one table.
    #[arg(long, value_enum, default_value_t = GgufFormat::Table)]
    pub format: GgufFormat,
    /// Add each tensor's physical extents on the block device (FIEMAP).
    #[arg(long)]
    pub extents: bool,
    /// JSON: include large metadata arrays (e.g. the vocabulary) in full.
    #[arg(long)]
    pub full: bool,
}

#[cfg(feature = "live")]
/// Options shared by `run` and `attach`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Trace file to write.
    #[arg(short, long, default_value = "ttrace.data")]
    pub output: std::path::PathBuf,
    /// Time every op: probe each graph node as it starts, on top of reading
    /// each graph once (the default, about 1 %). Each node then costs one
    /// trap and a 56-byte record (its tensors come from its graph).
    #[arg(long)]
    pub op_timing: bool,
    /// With op timing: record every worker thread's op calls (per-thread
    /// timing and work split), not only one record per node. Implies --op-timing.
    #[arg(long)]
    pub all_threads: bool,
    /// A library to probe, searched before the program's own (repeatable):
    /// e.g. a libggml-cpu.so loaded from an unusual place.
    #[arg(long, value_name = "PATH")]
    pub lib: Vec<std::path::PathBuf>,
    /// Ring buffer between kernel and ttrace, in MiB (a power of two from 1 to 2048).
    #[arg(long = "ring-mb", default_value = "16", value_name = "MIB", value_parser = ring_bytes)]
    pub ring_bytes: u32,
    /// A GGUF model whose page-cache fills and disk reads are watched from
    /// the start (repeatable). `run` also takes the command's own `-m` /
    /// `--model`; models the target maps later are found in its maps, and
    /// the file whisper.cpp's loader is given when it runs.
    #[arg(long, value_name = "GGUF")]
    pub model: Vec<std::path::PathBuf>,
    /// Trace only ops: no page faults, page-cache or block events.
    #[arg(long)]
    pub no_io: bool,
    /// Which tracepoint programs record page faults, page-cache fills and
    /// block requests. `btf` (tp_btf, reading kernel structs at offsets from
    /// /sys/kernel/btf/vmlinux) are skipped only when the same program is
    /// already running on a CPU; `perf` (perf-event tracepoints, the
    /// fallback for kernels without BTF) are skipped whenever any other BPF
    /// program runs there, so they can miss block completions. `auto`: btf
    /// where the kernel has BTF. The summary says which ran.
    #[arg(long, value_enum, default_value_t = TracepointChoice::Auto, value_name = "KIND")]
    pub tracepoints: TracepointChoice,
    /// Fingerprint every computed node's output (blake3, sum, RMS, min,
    /// max, NaN/Inf counts, edge values, a 64-dim projection), read when
    /// every thread is done with it. Costly: every node and barrier traps
    /// on every thread, and the bytes cross the ring (at least 128 MiB with it).
    #[arg(long, conflicts_with_all = ["op_timing", "all_threads"])]
    pub values: bool,
    /// With --values: keep only nodes whose name matches (all are still read).
    #[arg(long, value_name = "REGEX", requires = "values", value_parser = values_regex)]
    pub values_filter: Option<regex_lite::Regex>,
    /// Write a ring of trace files instead of one: OUTPUT.0000, OUTPUT.0001,
    /// … A file that has reached SIZE (512K, 100M, 2G) is closed with its
    /// trailer at the next decode call (so each holds whole decode calls)
    /// and the next begins; every file reads alone. `report`, `view`,
    /// `export` and `simulate` given OUTPUT read the files present as one
    /// run (given OUTPUT.NNNN, that file alone). Earlier files named
    /// OUTPUT.NNNN, and OUTPUT itself, are removed when recording starts.
    #[arg(long, value_name = "SIZE", value_parser = max_size)]
    pub max_size: Option<u64>,
    /// With --max-size: keep only the newest N files, deleting the oldest as
    /// the next begins. What is read of them is then a partial run, and
    /// `report` says which files and how much of the run's start are missing.
    #[arg(long, value_name = "N", requires = "max_size", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_files: Option<u32>,
}

/// `--max-size`: a size above zero.
#[cfg(feature = "live")]
fn max_size(text: &str) -> Result<u64, String> {
    match crate::units::parse_size(text) {
        Ok(0) => Err("the size must be above zero (e.g. 100M)".into()),
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(format!("`{text}`: {e} (e.g. 512K, 100M, 2G)")),
    }
}

#[cfg(feature = "live")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TracepointChoice {
    Auto,
    Btf,
    Perf,
}

#[cfg(feature = "live")]
/// `--ring-mb`: MiB, a power of two, to bytes.
#[cfg(feature = "live")]
fn ring_bytes(text: &str) -> Result<u32, String> {
    let mib: u32 = text.parse().map_err(|_| format!("`{text}` is not a whole number of MiB"))?;
    match mib.checked_mul(1 << 20) {
        Some(bytes) if mib.is_power_of_two() => Ok(bytes),
        _ => Err(format!("{mib} is not a power of two from 1 to 2048")),
    }
}

/// `--mem-limit`: a size such as 512M or 1.5G, to bytes.
#[cfg(feature = "live")]
fn mem_limit(text: &str) -> Result<u64, String> {
    crate::live::target::MemLimit::parse(text).map_err(|e| e.to_string())
}

#[cfg(feature = "live")]
/// `--duration`: seconds (`10`, `2.5`) or a duration with units (`90s`, `2m`, `500ms`).
fn duration(text: &str) -> Result<std::time::Duration, String> {
    let parsed = match text.trim().parse::<f64>() {
        Ok(secs) => std::time::Duration::try_from_secs_f64(secs).map_err(|e| e.to_string()),
        Err(_) => humantime::parse_duration(text.trim()).map_err(|e| e.to_string()),
    };
    match parsed {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("the duration must be above zero".into()),
        Err(e) => Err(format!("{e} (examples: 10, 2.5, 90s, 2m, 500ms)")),
    }
}

#[cfg(feature = "live")]
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: TraceArgs,
    /// Run the command as this user (default: the user who invoked sudo).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Sync and drop the page cache before starting: a cold-cache run.
    #[arg(long)]
    pub drop_caches: bool,
    /// Run the command in a memory cgroup with this limit (e.g. 512M, 2G),
    /// so a model larger than it is streamed from disk while generating.
    /// ttrace reads the cgroup's memory.stat every 5 ms, which keeps the
    /// statistics the kernel's reclaim decides by current (a new cgroup's
    /// lag up to 2 s, and short runs then spread 2-4x: docs/SIMULATE.md).
    #[arg(long, value_name = "SIZE", value_parser = mem_limit)]
    pub mem_limit: Option<u64>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[cfg(feature = "live")]
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Process to watch; without it, top starts the command after `--`.
    #[arg(long, conflicts_with_all = ["command", "mem_limit", "drop_caches", "user"])]
    pub pid: Option<u32>,
    /// Seconds between refreshes (0.5, 2) or with units (500ms).
    #[arg(long, default_value = "1", value_name = "DURATION", value_parser = duration)]
    pub interval: std::time::Duration,
    /// No screen: one JSON object per interval on stdout.
    #[arg(long)]
    pub json: bool,
    /// No screen: print one interval as JSON and exit.
    #[arg(long)]
    pub once: bool,
    /// Also record the trace to this file (as `run`/`attach` would).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    /// Evict the command's model files from the page cache before it starts
    /// (only those files; pages another process maps stay).
    #[arg(long)]
    pub drop_caches: bool,
    /// Run the command in a memory cgroup with this limit (e.g. 512M) and
    /// show its usage against it.
    #[arg(long, value_name = "SIZE", value_parser = mem_limit)]
    pub mem_limit: Option<u64>,
    /// Run the command as this user (default: the user who invoked sudo).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// A library to probe, searched before the program's own (repeatable).
    #[arg(long, value_name = "PATH")]
    pub lib: Vec<std::path::PathBuf>,
    /// A GGUF model to watch from the start (repeatable); the command's own
    /// `-m` is taken too, models mapped later are found in the maps.
    #[arg(long, value_name = "GGUF")]
    pub model: Vec<std::path::PathBuf>,
    /// Ring buffer between kernel and ttrace, in MiB (a power of two from 1 to 2048).
    #[arg(long = "ring-mb", default_value = "16", value_name = "MIB", value_parser = ring_bytes)]
    pub ring_bytes: u32,
    /// The command and its arguments (instead of --pid). Its output is
    /// discarded under the screen and goes to stderr with --json.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[cfg(feature = "live")]
#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub common: TraceArgs,
    /// Process to trace.
    #[arg(long)]
    pub pid: u32,
    /// Stop after this long: seconds (10, 2.5) or with units (90s, 2m, 500ms).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub duration: Option<std::time::Duration>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Trace file written by `ttrace run` or `ttrace attach`.
    #[arg(default_value = "ttrace.data")]
    pub file: std::path::PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page (heatmap of the model file per
    /// token, per-layer bytes, the summary).
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct ViewArgs {
    /// Trace file written by `ttrace run` or `ttrace attach` (one still
    /// being written is shown up to its last complete frame).
    #[arg(default_value = "ttrace.data")]
    pub file: std::path::PathBuf,
    /// Port to listen on (0: any free one).
    #[arg(long, default_value_t = 7575)]
    pub port: u16,
    /// Address to listen on. Anything but a loopback address serves the
    /// network, and then every request must carry the random token the
    /// printed URL holds.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Do not try to open the URL in a browser (xdg-open).
    #[arg(long)]
    pub no_open: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first run's trace (the reference).
    pub a: std::path::PathBuf,
    /// The second run's trace.
    pub b: std::path::PathBuf,
    /// Expert permutation per MoE layer: mbolt's perms.json, where
    /// `perm[p]` is the original expert stored at position p (B's expert p
    /// is A's expert perm[p]), or a JSON list of per-layer lists.
    #[arg(long, value_name = "perms.json")]
    pub perm: Option<std::path::PathBuf>,
    /// Which permutation of perms.json: chain_perm (mbolt --layout chain),
    /// clique_perm or heat_perm.
    #[arg(long, default_value = "chain_perm", requires = "perm")]
    pub perm_key: String,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page.
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<std::path::PathBuf>,
    /// Compare node output fingerprints (traces recorded with `--values`):
    /// the first node whose output differs, then drift per layer.
    #[arg(long, conflicts_with_all = ["perm", "html"])]
    pub values: bool,
    /// With --values: outputs differ only when RMS or the projection differ
    /// by more than this relative amount (default: any byte differs).
    #[arg(long, value_name = "X", requires = "values")]
    pub rtol: Option<f64>,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Trace file written by `ttrace run` or `ttrace attach`.
    #[arg(default_value = "ttrace.data")]
    pub file: std::path::PathBuf,
    #[arg(long, value_enum)]
    pub format: crate::export::Format,
    /// Output file (a directory for tokens-json).
    #[arg(short, long)]
    pub output: std::path::PathBuf,
    /// dot: the ubatch to draw (default: the first generate ubatch).
    #[arg(long, value_name = "K")]
    pub ubatch: Option<u32>,
}

mod simulate;
mod sweep;

pub use simulate::{Anon, LoadReplay, SimulateArgs};
pub use sweep::{SweepArgs, SweepCommand, SweepReportArgs};
