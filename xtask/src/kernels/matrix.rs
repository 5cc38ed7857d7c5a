//! Running the matrix: for each kernel one boot that runs every case (real
//! tests of the suite, with their oracles: llama.cpp's counters, its eval
//! callback, the kernel's blk tracer), then one table of kernel × case.
//! What needs no kernel of its own is built and decided on the host.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{Prepared, Support, qemu};
use crate::{cache, shell};

/// The guest's side, written into each job directory.
const GUEST_SH: &str = include_str!("guest.sh");
/// Where the guest mounts the test disk (the tests' TMPDIR is on it).
const DISK_MOUNT: &str = "/mnt/disk";
/// The test disk: the models' copies and every scratch file (sparse).
const DISK_BYTES: u64 = 3 << 30;
/// Models copied to the test disk (9p has no FIEMAP, which ttrace maps
/// block requests to tensors with).
const DISK_MODELS: &[&str] = &["tiny", "tiny-q8", "moe"];
/// The end of a failed case's log printed with its result.
const FAILED_LOG_LINES: usize = 60;
/// One boot runs every case; a guest still running after this is killed.
const BOOT_LIMIT: Duration = Duration::from_secs(40 * 60);

/// How one case runs in the guest.
enum Run {
    /// `ttrace ARGS`.
    Ttrace(&'static str),
    /// One pytest node of tests/python.
    Pytest(&'static str),
    /// The same, its tmp kept in the job directory: a failing case's trace
    /// survives the guest (for a case that has failed rarely, unexplained).
    PytestKept(&'static str),
    /// A pytest node with settings of its own (`NAME=VALUE ...`): fewer
    /// runs or a smaller model than on the host (the guest's CPU is emulated).
    PytestWith { node: &'static str, env: &'static str },
    /// One test of a Rust integration-test binary of tracer-user.
    Rust { binary: &'static str, test: &'static str },
    /// A shell command (`$TTRACE_BIN`, `$LLAMA` and `$TINY` are set).
    Shell(&'static str),
}

/// The cases, each a test that asserts against an independent oracle.
const CASES: &[(&str, Run)] = &[
    ("check", Run::Ttrace("check")),
    // Graph capture against llama.cpp's eval callback: every node, token id and weight byte.
    ("run tiny", Run::Pytest("test_graph_capture.py::test_graph_nodes_and_token_ids_match_the_eval_callback[tiny]")),
    // llama.cpp's own counters and the GGUF table, on the MoE model.
    ("run moe", Run::Pytest("test_trace_core.py::test_ubatches_match_llama_counters_and_weights_match_gguf[moe]")),
    ("attach", Run::Rust { binary: "trace_core", test: "attach_records_ops_and_detaches_leaving_target_running" }),
    (
        "blk --mem-limit",
        Run::Rust { binary: "io_trace", test: "a_cold_memory_limited_run_on_its_own_disk_matches_the_blk_tracer" },
    ),
    (
        "--op-timing",
        Run::Pytest("test_trace_core.py::test_ubatches_match_llama_counters_and_weights_match_gguf[tiny-op-timing]"),
    ),
    ("--values", Run::PytestKept("test_values.py::test_values_match_the_eval_callback[tiny]")),
    ("top --json", Run::Pytest("test_top.py::test_moe_expert_grid_equals_the_traces_routing")),
    // The library hold following a command's children to their exec (the
    // fork record's layout differs between kernels). One run of the tiny
    // model: the layout is what differs here, a run of Gemma read over 9p
    // under emulation cost 100-144 s of CI's 90 minutes, and the host
    // repeats it with Gemma for races.
    (
        "dlopen grandchild",
        Run::PytestWith {
            node: "test_dlopen_start.py::test_dlopened_llama_in_a_grandchild_traced_from_its_first_graph",
            env: "TTRACE_TEST_RUNS=1 TTRACE_DLOPEN_MODEL=tiny",
        },
    ),
];

/// `check` where stand-ins load: it passes, naming them as fallbacks with
/// the kernel release that has what they stand in for.
const STAND_IN_CHECK: (&str, Run) = (
    "check",
    Run::Shell(
        r#""$TTRACE_BIN" check > out 2>&1; status=$?; cat out; test $status = 0 && grep -q 'fallback (.*Linux [0-9.]*' out"#,
    ),
);

/// The cases a kernel runs.
fn cases_for(series: &str) -> Vec<&'static (&'static str, Run)> {
    let stand_ins = super::spec(series).is_some_and(|k| k.support == Support::StandIns);
    CASES.iter().map(|case| if stand_ins && case.0 == "check" { &STAND_IN_CHECK } else { case }).collect()
}

/// What the host gives the guest.
pub struct Inputs<'a> {
    pub ttrace: &'a Path,
    /// The host's paths.json (set-up's), rewritten for the guest.
    pub paths: &'a serde_json::Value,
    pub venv_python: &'a Path,
    /// A llama.cpp build without host-only instructions (GGML_NATIVE off).
    pub portable_bin: &'a Path,
    /// Scratch: job directories and disks.
    pub work: &'a Path,
}

/// One case's outcome in one kernel, over its runs (`--repeat`).
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub runs: u32,
    pub failures: u32,
    /// Over all its runs.
    pub seconds: f64,
    /// The first failed run's log, as `logs/<this>.log`.
    pub first_failure: Option<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.runs > 0 && self.failures == 0
    }

    /// `pass 61s`, or with repeats `pass x20 61s` / `FAIL 2/20 61s` (seconds a run).
    fn cell(&self, bold: bool) -> String {
        let per_run = self.seconds / f64::from(self.runs.max(1));
        let fail = if bold { "**FAIL**" } else { "FAIL" };
        match (self.passed(), self.runs) {
            (true, 1) => format!("pass {per_run:.0}s"),
            (true, n) => format!("pass x{n} {per_run:.0}s"),
            (false, 1) => format!("{fail} {per_run:.0}s"),
            (false, n) => format!("{fail} {}/{n} {per_run:.0}s", self.failures),
        }
    }
}

/// Kernel release → case → outcome (a case with no outcome did not run).
pub struct Table {
    pub kernels: Vec<(Prepared, String, Duration)>,
    pub outcomes: BTreeMap<(String, String), Outcome>,
    /// Cases that were to run, over all kernels.
    expected: usize,
    /// How many times each case was to run.
    repeat: u32,
}

/// Boots each kernel with every case (or those whose name contains `only`),
/// each run `repeat` times, as many guests at once as the host has cores and
/// memory for.
pub fn run(kernels: &[Prepared], inputs: &Inputs<'_>, only: Option<&str>, repeat: u32) -> Result<Table> {
    let rust = rust_test_binaries()?;
    let accel = qemu::Accel::detect();
    let mut jobs = Vec::new();
    for kernel in kernels {
        let cases: Vec<&(&str, Run)> =
            cases_for(&kernel.series).into_iter().filter(|(name, _)| only.is_none_or(|o| name.contains(o))).collect();
        let dir = inputs.work.join(format!("job-{}", kernel.series));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        write_job(&dir, &cases, repeat, &rust, inputs)?;
        jobs.push((kernel, dir, cases.len()));
    }
    let at_once = accel.guests_at_once().min(jobs.len().max(1));
    eprintln!("kernels: {} boots, {at_once} at a time, {accel:?}", jobs.len());
    let next = AtomicUsize::new(0);
    let booted: Vec<Mutex<Option<Result<Duration>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..at_once {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some((kernel, dir, cases)) = jobs.get(index) else { break };
                    let outcome = boot_one(kernel, dir, *cases, repeat, accel, inputs);
                    *booted[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
                }
            });
        }
    });
    let mut table = Table { kernels: Vec::new(), outcomes: BTreeMap::new(), expected: 0, repeat };
    for ((kernel, dir, cases), booted) in jobs.iter().zip(booted) {
        table.expected += cases;
        let elapsed = match booted.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(Ok(elapsed)) => elapsed,
            Some(Err(e)) => {
                eprintln!("kernels: {}: {e:#}", kernel.series);
                Duration::ZERO
            }
            None => Duration::ZERO,
        };
        let release = std::fs::read_to_string(dir.join("kernel")).unwrap_or_default().trim().to_string();
        for (name, outcome) in read_results(dir)? {
            table.outcomes.insert((kernel.series.clone(), name), outcome);
        }
        table.kernels.push(((*kernel).clone(), release, elapsed));
    }
    Ok(table)
}

/// One guest: its disk, its boot, and what it reports as it ends.
fn boot_one(
    kernel: &Prepared,
    job: &Path,
    cases: usize,
    repeat: u32,
    accel: qemu::Accel,
    inputs: &Inputs<'_>,
) -> Result<Duration> {
    let disk = inputs.work.join(format!("disk-{}.img", kernel.series));
    make_disk(&disk, inputs.paths)?;
    let times = if repeat > 1 { format!(", each {repeat} times") } else { String::new() };
    eprintln!("kernels: booting {} ({}) with {cases} cases{times}", kernel.series, kernel.package);
    let boot = qemu::Boot {
        vmlinuz: &kernel.vmlinuz,
        initramfs: &kernel.initramfs,
        job,
        disk: &disk,
        accel,
        limit: BOOT_LIMIT * repeat,
    };
    let booted = qemu::boot(&boot);
    let _ = std::fs::remove_file(&disk);
    if let Some(crash) = qemu::crash(job) {
        eprintln!(
            "kernels: {}: the guest kernel crashed: {crash} (see {})",
            kernel.series,
            job.join("console.log").display()
        );
    }
    let elapsed = booted.with_context(|| format!("kernel {}", kernel.series))?;
    if let Ok(why) = std::fs::read_to_string(job.join("logs/setup.log")) {
        eprintln!("kernels: {}: the guest could not start its cases: {}", kernel.series, why.trim());
    }
    for (name, outcome) in read_results(job)? {
        let log = outcome.first_failure.as_ref().map(|run| log_path(job, run));
        let at = log.as_ref().map(|log| format!(", log {}", log.display()));
        eprintln!("kernels: {} {name}: {}{}", kernel.series, outcome.cell(false), at.unwrap_or_default());
        // CI keeps only what is printed: a rare failure says why here.
        if let Some(text) = log.and_then(|log| std::fs::read_to_string(log).ok()) {
            let lines: Vec<&str> = text.lines().collect();
            for line in &lines[lines.len().saturating_sub(FAILED_LOG_LINES)..] {
                eprintln!("kernels: {} {name} | {line}", kernel.series);
            }
        }
    }
    Ok(elapsed)
}

fn log_path(job: &Path, run: &str) -> PathBuf {
    job.join("logs").join(format!("{run}.log"))
}

/// A case name as a file name.
fn file_name(case: &str) -> String {
    case.trim_start_matches('-').replace([' ', '-'], "_")
}

/// A run's name in the guest's files: the case's, numbered when repeated.
fn run_name(case: &str, repeat: u32, i: u32) -> String {
    if repeat == 1 { file_name(case) } else { format!("{}.{i}", file_name(case)) }
}

fn write_job(
    job: &Path,
    cases: &[&(&str, Run)],
    repeat: u32,
    rust: &BTreeMap<String, PathBuf>,
    inputs: &Inputs<'_>,
) -> Result<()> {
    let repo = cache::repo_root();
    let mut tsv = String::new();
    let mut names = String::new();
    for ((name, run), i) in cases.iter().flat_map(|case| (1..=repeat).map(move |i| (case, i))) {
        let key = run_name(name, repeat, i);
        let command = match run {
            Run::Ttrace(args) => format!("\"$TTRACE_BIN\" {args}"),
            Run::Pytest(node) => format!(
                "\"$VENV_PYTHON\" -m pytest -q -p no:cacheprovider {}",
                shell_quote(&repo.join("tests/python").join(node).display().to_string())
            ),
            Run::PytestKept(node) => format!(
                "\"$VENV_PYTHON\" -m pytest -q -p no:cacheprovider --basetemp=/job/pytest-{key} {}",
                shell_quote(&repo.join("tests/python").join(node).display().to_string())
            ),
            Run::PytestWith { node, env } => format!(
                "{env} \"$VENV_PYTHON\" -m pytest -q -p no:cacheprovider {}",
                shell_quote(&repo.join("tests/python").join(node).display().to_string())
            ),
            Run::Rust { binary, test } => {
                let exe = rust.get(*binary).with_context(|| format!("no integration-test binary `{binary}`"))?;
                format!("{} --exact {test} --nocapture", shell_quote(&exe.display().to_string()))
            }
            // One line of cases.tsv each.
            Run::Shell(command) => command.replace('\n', " "),
        };
        writeln!(tsv, "{key}\t{command}")?;
        writeln!(names, "{key}\t{name}")?;
    }
    std::fs::write(job.join("cases.tsv"), tsv)?;
    std::fs::write(job.join("names.tsv"), names)?;
    let portable = inputs.portable_bin;
    let mut paths = inputs.paths.clone();
    paths["llama_completion"] = portable.join("llama-completion").display().to_string().into();
    paths["llama_lib_dir"] = portable.display().to_string().into();
    for model in DISK_MODELS {
        let host = paths["models"][model].as_str().with_context(|| format!("set-up has no model `{model}`"))?;
        let name = Path::new(host).file_name().context("a model file name")?.to_string_lossy().into_owned();
        paths["models"][model] = format!("{DISK_MOUNT}/models/{name}").into();
    }
    std::fs::write(job.join("paths.json"), serde_json::to_string_pretty(&paths)?)?;
    let env = [
        ("TTRACE_BIN", inputs.ttrace.display().to_string()),
        // The job directory is /job in the guest.
        ("TTRACE_PATHS", "/job/paths.json".to_string()),
        ("VENV_PYTHON", inputs.venv_python.display().to_string()),
        // The `llama_cpp` client's oracles load the portable build's libllama.
        ("LLAMA_CPP_LIB_PATH", portable.display().to_string()),
        ("TMPDIR", format!("{DISK_MOUNT}/tmp")),
        ("LLAMA", portable.join("llama-completion").display().to_string()),
        ("TINY", paths["models"]["tiny"].as_str().unwrap_or_default().to_string()),
        ("PYTHONDONTWRITEBYTECODE", "1".into()),
        ("PATH", std::env::var("PATH").unwrap_or_default()),
        ("HOME", "/root".into()),
    ];
    let env: String = env.iter().map(|(k, v)| format!("export {k}={}\n", shell_quote(v))).collect();
    std::fs::write(job.join("env"), env)?;
    std::fs::write(job.join("guest.sh"), GUEST_SH)?;
    Ok(())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// An ext4 image holding the models and an empty world-writable `tmp`.
fn make_disk(image: &Path, paths: &serde_json::Value) -> Result<()> {
    let staging = image.with_extension("staging");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(staging.join("models"))?;
    std::fs::create_dir_all(staging.join("tmp"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(staging.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    for model in DISK_MODELS {
        let host = PathBuf::from(paths["models"][model].as_str().context("a model path")?);
        std::fs::copy(&host, staging.join("models").join(host.file_name().context("a model file name")?))?;
    }
    let _ = std::fs::remove_file(image);
    std::fs::File::create(image)?.set_len(DISK_BYTES)?;
    shell::run(Command::new("mkfs.ext4").args(["-q", "-F", "-d"]).arg(&staging).arg(image))
        .context("making the guest's test disk (Debian package e2fsprogs)")?;
    std::fs::remove_dir_all(&staging)?;
    Ok(())
}

/// The guest's `results.tsv`, by case name (repeated runs summed).
fn read_results(job: &Path) -> Result<Vec<(String, Outcome)>> {
    let names: BTreeMap<String, String> = std::fs::read_to_string(job.join("names.tsv"))?
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(file, name)| (file.to_string(), name.to_string()))
        .collect();
    let text = std::fs::read_to_string(job.join("results.tsv")).unwrap_or_default();
    let mut out: Vec<(String, Outcome)> = Vec::new();
    for line in text.lines() {
        let mut fields = line.split('\t');
        let (Some(file), Some(status), Some(seconds)) = (fields.next(), fields.next(), fields.next()) else {
            bail!("malformed line in {}: {line}", job.join("results.tsv").display());
        };
        let name = names.get(file).cloned().unwrap_or_else(|| file.to_string());
        let at = match out.iter().position(|(n, _)| *n == name) {
            Some(at) => at,
            None => {
                out.push((name, Outcome::default()));
                out.len() - 1
            }
        };
        let outcome = &mut out[at].1;
        outcome.runs += 1;
        outcome.seconds += seconds.parse().unwrap_or(0.0);
        if status != "pass" {
            outcome.failures += 1;
            outcome.first_failure.get_or_insert_with(|| file.to_string());
        }
    }
    Ok(out)
}

/// Integration-test binaries of tracer-user, as `cargo xtask test` built them.
fn rust_test_binaries() -> Result<BTreeMap<String, PathBuf>> {
    let out = shell::output(Command::new("cargo").current_dir(cache::repo_root()).args([
        "test",
        "--no-run",
        "--quiet",
        "-p",
        "tracer-user",
        "--message-format=json",
    ]))?;
    let mut found = BTreeMap::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str()) else { continue };
        if msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test")) {
            found.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    Ok(found)
}

impl Table {
    /// Every case ran as often as asked and passed in every kernel.
    pub fn all_passed(&self) -> bool {
        self.outcomes.len() == self.expected && self.outcomes.values().all(|o| o.passed() && o.runs == self.repeat)
    }

    /// kernel × case, pass/fail and seconds (markdown, also for the README).
    pub fn render(&self) -> String {
        let names: Vec<&str> = CASES.iter().map(|(n, _)| *n).collect();
        let mut s = String::from("| kernel | Debian package |");
        for n in &names {
            let _ = write!(s, " `{n}` |");
        }
        s.push_str(" boot |\n|---|---|");
        s.push_str(&"---|".repeat(names.len() + 1));
        s.push('\n');
        for (k, release, elapsed) in &self.kernels {
            let spec = super::spec(&k.series);
            let used_by = spec.map_or("", |m| m.used_by);
            let how = match spec.map(|m| m.support) {
                Some(Support::StandIns) => ", with stand-ins `ttrace check` lists",
                _ => "",
            };
            let _ = write!(s, "| {} ({used_by}; `{release}`{how}) | {} {} |", k.series, k.package, k.version);
            for n in &names {
                match self.outcomes.get(&(k.series.clone(), (*n).to_string())) {
                    Some(o) => {
                        let _ = write!(s, " {} |", o.cell(true));
                    }
                    None => s.push_str(" - |"),
                }
            }
            let _ = writeln!(s, " {:.0}s |", elapsed.as_secs_f64());
        }
        s
    }
}
