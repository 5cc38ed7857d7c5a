//! `cargo xtask dist`: a release users install without Rust. One statically
//! linked `ttrace` (musl: it runs on any x86_64 Linux, whatever its libc),
//! with the eBPF object and the viewer embedded, packed twice into
//! target/dist/: `ttrace-<version>-x86_64-linux.tar.gz` and
//! `ttrace_<version>_amd64.deb`, plus their SHA256SUMS. `--verify` then
//! installs the .deb in a clean Debian root and traces a model there
//! ([`chroot`]).

mod chroot;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cache, setup, shell, viewer};

/// musl links statically by default; glibc's static binaries would still
/// load NSS modules (user names for `run --user`) from the host at run time.
const TARGET: &str = "x86_64-unknown-linux-musl";
/// Pinned like bpf-linker: a newer one may change what it packages.
const CARGO_DEB_VERSION: &str = "3.8.0";
/// The files beside the binary in the tarball (the .deb's come from
/// tracer-user's `[package.metadata.deb]`).
const DOCS: &[&str] = &["README.md", "LICENSE-MIT", "LICENSE-APACHE"];

/// What `build` made.
pub struct Artefacts {
    /// As the binary reports it (`ttrace -V`), so names match what users see.
    pub version: String,
    /// `ttrace --version`: version, commit and the eBPF object's hash.
    pub long_version: String,
    pub binary: PathBuf,
    pub tarball: PathBuf,
    pub deb: PathBuf,
}

pub fn run(verify: bool) -> Result<()> {
    let started = Instant::now();
    // Verifying traces llama-completion on a generated model: the whole
    // set-up. The build alone needs only the eBPF toolchain and the viewer.
    let paths = if verify {
        Some(setup::run()?)
    } else {
        setup::build_tools()?;
        eprintln!("dist: viewer: {}", viewer::ensure()?);
        None
    };
    let artefacts = build()?;
    eprintln!("dist: built in {:.0}s", started.elapsed().as_secs_f64());
    if let Some(paths) = paths {
        let t = Instant::now();
        chroot::verify(&paths, &artefacts)?;
        eprintln!("dist: verified in a clean Debian root in {:.0}s", t.elapsed().as_secs_f64());
    }
    println!("{}", artefacts.binary.display());
    println!("{}", artefacts.tarball.display());
    println!("{}", artefacts.deb.display());
    Ok(())
}

/// `cargo xtask test`'s release: built, installed in the clean root and
/// checked there; the kernel matrix then runs its binary.
pub fn build_and_verify(paths: &setup::Paths) -> Result<Artefacts> {
    let artefacts = build()?;
    chroot::verify(paths, &artefacts)?;
    Ok(artefacts)
}

fn build() -> Result<Artefacts> {
    ensure_musl()?;
    ensure_cargo_deb()?;
    let root = cache::repo_root();
    let commit = commit_label(&root)?;
    let t = Instant::now();
    // --locked: a release is built from the committed Cargo.lock, never a re-resolved one.
    shell::run(
        Command::new("cargo")
            .current_dir(&root)
            .args(["build", "--release", "--locked", "--target", TARGET, "-p", "tracer-user", "--bin", "ttrace"])
            .env("TTRACE_GIT_COMMIT", &commit)
            // Not a static PIE: a plain static executable, which `ldd` and
            // `file` call what it is ("not a dynamic executable").
            .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS", "-C relocation-model=static"),
    )?;
    eprintln!("dist: cargo build --target {TARGET}: {:.0}s", t.elapsed().as_secs_f64());
    let target_dir = cache::target_dir();
    let binary = target_dir.join(TARGET).join("release/ttrace");
    check_static(&binary)?;

    let short = shell::output(Command::new(&binary).arg("-V"))?;
    let long_version = shell::output(Command::new(&binary).arg("--version"))?.trim().to_string();
    // `ttrace 0.1.0 (abc1234)`
    let version = short.split_whitespace().nth(1).context("`ttrace -V` printed no version")?.to_string();
    if !long_version.contains("eBPF object blake3 ") {
        bail!("the release binary has no eBPF object: `{long_version}`");
    }
    if long_version.contains("-dirty") {
        eprintln!("dist: WARNING: built from uncommitted changes: {long_version}");
    }
    eprintln!("dist: {long_version}");

    let dist = target_dir.join("dist");
    // Only this build's files: an older version's would pass for current.
    let _ = std::fs::remove_dir_all(&dist);
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    // Files in both archives carry the commit's time, not the build's, so
    // two builds of one commit give the same bytes.
    let epoch = shell::output(Command::new("git").current_dir(&root).args(["log", "-1", "--format=%ct"]))
        .map(|t| t.trim().to_string())
        .unwrap_or_else(|_| "0".into());
    let tarball = tarball(&root, &binary, &dist, &version, &epoch)?;
    let deb = dist.join(format!("ttrace_{version}_amd64.deb"));
    // --no-strip: the .deb carries the very file the tarball does (cargo's
    // release profile already drops debug info; the symbols name panics).
    shell::run(
        Command::new("cargo")
            .current_dir(&root)
            .args(["deb", "-p", "tracer-user", "--target", TARGET, "--no-build", "--no-strip", "--output"])
            .arg(&deb)
            .env("SOURCE_DATE_EPOCH", &epoch)
            // It prints the package's path: our stdout is only the final list.
            .stdout(std::io::stderr()),
    )?;
    shell::run(Command::new("dpkg-deb").arg("--info").arg(&deb))?;
    shell::run(Command::new("dpkg-deb").arg("--contents").arg(&deb))?;
    let sums = shell::output(
        Command::new("sha256sum")
            .current_dir(&dist)
            .args([tarball.file_name().expect("named"), deb.file_name().expect("named")]),
    )?;
    std::fs::write(dist.join("SHA256SUMS"), sums)?;
    Ok(Artefacts { version, long_version, binary, tarball, deb })
}

/// The commit as tracer-user/build.rs labels it, from the tree as it is now:
/// build.rs alone would keep the label of the last build that changed a
/// source, which after a commit of other files is stale.
fn commit_label(root: &Path) -> Result<String> {
    let git =
        |args: &[&str]| shell::output(Command::new("git").current_dir(root).arg("--no-optional-locks").args(args));
    let hash = git(&["rev-parse", "--short", "HEAD"])?.trim().to_string();
    Ok(if git(&["status", "--porcelain"])?.trim().is_empty() { hash } else { format!("{hash}-dirty") })
}

/// A binary with an ELF interpreter (PT_INTERP) needs that dynamic loader
/// and its libraries on the user's machine; a static(-pie) one needs neither.
fn check_static(binary: &Path) -> Result<()> {
    let elf = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        bail!("{} is not a 64-bit ELF file", binary.display());
    }
    let word = |at: usize, len: usize| -> Result<u64> {
        let bytes = elf.get(at..at + len).context("truncated ELF header")?;
        Ok(bytes.iter().rev().fold(0, |acc, b| acc << 8 | u64::from(*b)))
    };
    let (phoff, phentsize, phnum) = (word(0x20, 8)?, word(0x36, 2)?, word(0x38, 2)?);
    const PT_INTERP: u64 = 3;
    for i in 0..phnum {
        if word(usize::try_from(phoff + i * phentsize)?, 4)? == PT_INTERP {
            bail!("{} is dynamically linked (it has an ELF interpreter)", binary.display());
        }
    }
    // What a user would check.
    let ldd = Command::new("ldd").arg(binary).output().context("running ldd")?;
    let said = String::from_utf8_lossy(&ldd.stdout) + String::from_utf8_lossy(&ldd.stderr);
    if !said.contains("not a dynamic executable") {
        bail!("`ldd {}` says `{}`, not \"not a dynamic executable\"", binary.display(), said.trim());
    }
    eprintln!("dist: ldd: {}", said.trim());
    Ok(())
}

/// `ttrace-<version>-x86_64-linux/{ttrace,README.md,LICENSE-*}`, with owner,
/// order and times (`epoch`) fixed.
fn tarball(root: &Path, binary: &Path, dist: &Path, version: &str, epoch: &str) -> Result<PathBuf> {
    let name = format!("ttrace-{version}-x86_64-linux");
    let staging = dist.join(&name);
    std::fs::create_dir_all(&staging)?;
    std::fs::copy(binary, staging.join("ttrace")).context("copying ttrace")?;
    for doc in DOCS {
        std::fs::copy(root.join(doc), staging.join(doc)).with_context(|| format!("copying {doc}"))?;
    }
    let tarball = dist.join(format!("{name}.tar.gz"));
    shell::run(
        Command::new("tar")
            .current_dir(dist)
            .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mode=u+rw,go+r,go-w"])
            .arg(format!("--mtime=@{epoch}"))
            // -n: no name or time in the gzip header either.
            .args(["--use-compress-program=gzip -n -9", "-cf"])
            .arg(&tarball)
            .arg(&name),
    )?;
    std::fs::remove_dir_all(&staging)?;
    Ok(tarball)
}

/// The musl target's standard library, and musl-gcc for the crates that
/// compile C (blake3's SIMD code).
fn ensure_musl() -> Result<()> {
    let installed = shell::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed.lines().any(|t| t.trim() == TARGET) {
        shell::run(Command::new("rustup").args(["target", "add", TARGET]))?;
    }
    if !shell::succeeds(Command::new("musl-gcc").arg("--version")) {
        if !shell::is_root() {
            bail!("musl-gcc is missing; install it with `sudo apt-get install musl-tools`");
        }
        shell::run(Command::new("apt-get").args(["install", "-y", "-q", "--no-install-recommends", "musl-tools"]))?;
    }
    Ok(())
}

/// cargo-deb into ~/.cargo/bin, once (about 2 minutes on 2 cores).
fn ensure_cargo_deb() -> Result<()> {
    let have = shell::output(Command::new("cargo-deb").arg("--version")).unwrap_or_default();
    if have.split_whitespace().any(|w| w.trim_start_matches('v') == CARGO_DEB_VERSION) {
        return Ok(());
    }
    eprintln!("dist: installing cargo-deb {CARGO_DEB_VERSION}");
    shell::run(Command::new("cargo").args(["install", "--locked", &format!("cargo-deb@{CARGO_DEB_VERSION}")]))
}
