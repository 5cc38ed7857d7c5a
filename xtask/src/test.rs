//! `cargo xtask test`: set up, then run every test: the Rust suites (the
//! eBPF ones load real programs and need root; they fail, never skip, without
//! it) and the Python oracle tests in tests/python.

use std::{process::Command, time::Instant};

use anyhow::{Result, bail};

use crate::{
    cache, demo, dist, kernels,
    scratch::{self, TestTmp},
    setup, shell,
};

pub fn run(cargo_args: &[String]) -> Result<()> {
    if cargo_args.is_empty() {
        scratch::check_free_space()?;
    }
    let mut phases = Phases::start();
    let paths = setup::run()?;
    let paths_json = demo::write_paths_file(&paths)?;
    if !shell::is_root() {
        eprintln!("xtask: not root: the eBPF tests will fail; run `sudo -E cargo xtask test` to run them");
    }
    let root = cache::repo_root();
    // Python names are only resolved when a test reaches them: check them all first.
    shell::run(Command::new(&paths.venv_python).current_dir(&root).args([
        "-m",
        "pyflakes",
        "tests/python",
        "scripts",
    ]))?;
    let ttrace = demo::build_ttrace()?;
    let tmp = TestTmp::create()?;
    phases.end("set-up and build");

    let mut failures = Vec::new();
    let mut cargo = Command::new("cargo");
    cargo
        .current_dir(&root)
        // Every test binary runs even after one fails, so a run shows all failures.
        .args(["test", "--no-fail-fast", "--workspace", "--exclude", "tracer-ebpf"])
        .args(cargo_args)
        .env("TTRACE_PATHS", &paths_json)
        .env("TMPDIR", tmp.path())
        // The root tests run the release binary users get (its attach speed
        // is what `attach` promises), not the debug one cargo builds for them.
        .env("TTRACE_BIN", &ttrace);
    if let Err(e) = shell::run(&mut cargo) {
        failures.push(e.to_string());
    }
    phases.end("Rust suites");
    if cargo_args.is_empty() {
        // Screenshots of the HTML reports outlive the run (target/ is
        // gitignored), so they can be looked at afterwards.
        let screenshots = root.join("target/ttrace-test-screenshots");
        std::fs::create_dir_all(&screenshots)?;
        let mut pytest = Command::new(&paths.venv_python);
        pytest
            .current_dir(&root)
            // The slowest tests listed: CI has 90 minutes for everything.
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=15", "tests/python"])
            .env("TTRACE_PATHS", &paths_json)
            .env("TTRACE_BIN", &ttrace)
            .env("TMPDIR", tmp.path())
            .env("TTRACE_SCREENSHOT_DIR", &screenshots);
        if let Err(e) = shell::run(&mut pytest) {
            failures.push(e.to_string());
        }
        eprintln!("xtask: screenshots of the HTML reports in {}", screenshots.display());
        phases.end("Python suites");
        // Last: the release users install (static, in a clean Debian root),
        // then the same tests inside each kernel of the matrix, with it.
        let release = dist::build_and_verify(&paths);
        phases.end("release and clean root");
        if let Err(e) = release.and_then(|r| kernel_matrix(&paths, &r.binary, &tmp, &[], None, 1)) {
            failures.push(format!("{e:#}"));
        }
        phases.end("kernel matrix");
    }
    phases.print();
    if !failures.is_empty() {
        eprintln!("xtask: the failed run's scratch files are kept in {}", tmp.path().display());
        bail!("test suites failed: {}", failures.join("; "));
    }
    tmp.remove();
    eprintln!("xtask: all test suites passed");
    Ok(())
}

/// `cargo xtask kernels`: set up, build the release, and run the kernel matrix alone.
pub fn run_kernels(series: &[String], case: Option<&str>, repeat: u32) -> Result<()> {
    scratch::check_free_space()?;
    let paths = setup::run()?;
    let ttrace = dist::build_and_verify(&paths)?.binary;
    let tmp = TestTmp::create()?;
    kernel_matrix(&paths, &ttrace, &tmp, series, case, repeat)?;
    tmp.remove();
    Ok(())
}

/// Runs the matrix (those `series`, or all) and prints its table; a full
/// run also rewrites the README's "Supported kernels" table.
fn kernel_matrix(
    paths: &setup::Paths,
    ttrace: &std::path::Path,
    tmp: &TestTmp,
    series: &[String],
    case: Option<&str>,
    repeat: u32,
) -> Result<()> {
    let chosen: Vec<_> =
        paths.kernels.iter().filter(|k| series.is_empty() || series.contains(&k.series)).cloned().collect();
    if chosen.is_empty() {
        bail!(
            "no kernel of the matrix is called {}; they are {}",
            series.join(", "),
            kernels::KERNELS.map(|k| k.series).join(", ")
        );
    }
    let inputs = kernels::matrix::Inputs {
        ttrace,
        paths: &paths.to_json(),
        venv_python: &paths.venv_python,
        portable_bin: &paths.llama_portable,
        work: tmp.path(),
    };
    let table = kernels::matrix::run(&chosen, &inputs, case, repeat)?;
    let rendered = table.render();
    eprintln!("\nkernel matrix:\n{rendered}");
    let passed = table.all_passed();
    // The README shows the last full run that passed.
    if passed && series.is_empty() && case.is_none() && repeat == 1 {
        kernels::readme::write_table(&rendered)?;
    }
    if !passed {
        bail!("the kernel matrix failed (table above; logs in {})", tmp.path().display());
    }
    Ok(())
}

/// How long each part of a test run took, printed at its end (CI's limit is
/// 90 minutes for all of them, set-up included).
struct Phases {
    started: Instant,
    last: Instant,
    done: Vec<(&'static str, f64)>,
}

impl Phases {
    fn start() -> Self {
        let now = Instant::now();
        Self { started: now, last: now, done: Vec::new() }
    }

    fn end(&mut self, name: &'static str) {
        let now = Instant::now();
        self.done.push((name, (now - self.last).as_secs_f64()));
        self.last = now;
    }

    fn print(&self) {
        let parts: Vec<String> = self.done.iter().map(|(name, s)| format!("{name} {:.0}s", s)).collect();
        eprintln!("xtask: test run {:.0}s: {}", self.started.elapsed().as_secs_f64(), parts.join(", "));
    }
}
