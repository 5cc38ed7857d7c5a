//! `ttrace sweep`'s arguments.

use clap::{Args, Subcommand};

pub(super) const SWEEP_HELP: &str = "Example plan (plan.toml):\n\n  \
models = [\"gemma-3-270m-q4_k_m.gguf\", { path = \"moe.gguf\", mem_limits = [\"32M\", \"48M\"] }]\n  \
threads = [2]\n  \
mem_limits = [\"160M\", \"none\"]        # sizes as --mem-limit takes them, \"none\": no limit (a model may have its own)\n  \
cache = \"cold\"                         # cold: a private copy of each model, evicted before every run; warm (default)\n  \
repeats = 2\n  \
n_predict = 8\n  \
ctx = 256                              # -c\n\n  \
[command]                              # optional\n  \
kind = \"completion\"                    # llama-completion; or \"server\" (below)\n  \
program = \"/path/to/llama-completion\"  # default: llama-completion (llama-server) from PATH\n  \
args = [\"--ignore-eos\", \"--temp\", \"0\"]\n  \
# kind = \"server\": llama-server -np CLIENTS, sent CLIENTS concurrent /completion requests of the\n  \
# prompt, then stopped; clients = 4, request = { ignore_eos = true, temperature = 0 } (more fields)\n\n  \
[[prompts]]\n  \
domain = \"code\"\n  \
text = \"def quicksort(xs):\"\n\n  \
[[prompts]]\n  \
domain = \"math\"\n  \
file = \"prompts/math.txt\"             # relative to the plan\n\n\
Runs are every model x prompt x threads x mem_limit x repeat. DIR gets traces/<run_id>.data, logs/<run_id>.log \
(the command's output), runs/<run_id>.json (a finished run) and dataset/table=T/model=M/run_id=R/part-0.parquet \
(schema: docs/DATASET.md). A failed run is recorded with its error and the others go on; ttrace then exits 1 \
(`--retry-failed` reruns them).\n\n\
Examples:\n  \
sudo ttrace sweep plan.toml -o sweep1\n  \
ttrace sweep report sweep1              # sweep1/report.json and report.html\n  \
duckdb -c \"select model, domain, disk_bytes_per_token from read_parquet('sweep1/dataset/table=runs/*/*/*.parquet', hive_partitioning=true)\"";

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The plan (TOML).
    #[arg(value_name = "PLAN.toml", required = true)]
    pub plan: Option<std::path::PathBuf>,
    /// The sweep's directory (created; reused to resume).
    #[arg(short, long, value_name = "DIR", required = true)]
    pub output: Option<std::path::PathBuf>,
    /// Also write the `ops` table: every op of every run (the large one).
    #[arg(long)]
    pub ops: bool,
    /// Run again the runs that failed before (by default a rerun skips
    /// every finished run, failed or not).
    #[arg(long)]
    pub retry_failed: bool,
    /// Run the commands as this user (default: the user behind sudo).
    #[arg(long)]
    pub user: Option<String>,
    #[command(subcommand)]
    pub command: Option<SweepCommand>,
}

#[derive(Debug, Subcommand)]
pub enum SweepCommand {
    /// Compare a sweep's runs: per domain the experts' activation
    /// distributions, the domains' cosine similarity, stickiness, disk bytes
    /// per token against memory limit per model, and the spread across
    /// repeats. Writes DIR/report.json and DIR/report.html. Needs no root.
    Report(SweepReportArgs),
}

#[derive(Debug, Args)]
pub struct SweepReportArgs {
    /// The sweep's directory.
    pub dir: std::path::PathBuf,
    /// Where the JSON goes (default DIR/report.json).
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Where the HTML goes (default DIR/report.html).
    #[arg(long)]
    pub html: Option<std::path::PathBuf>,
}
