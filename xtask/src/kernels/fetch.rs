//! Debian's kernel packages, fetched with `apt-get download` through an apt
//! configuration of our own (its lists under the cache), so the machine's
//! own apt sources and state stay as they are. The archive's address is the
//! one the machine's apt already uses (its `debian.sources`): nothing else
//! is reachable here, and no host name is written into the project.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::shell;

use super::Kernel;

/// The machine's Debian source lists, where the archive's URIs come from.
const HOST_SOURCES: &[&str] = &["/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"];
/// The suites the matrix takes kernels from.
const SUITES: &[(&str, Archive)] = &[
    ("bullseye-security", Archive::Security),
    ("bookworm", Archive::Main),
    ("trixie", Archive::Main),
    ("trixie-backports", Archive::Main),
    ("sid", Archive::Main),
];
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Lists older than this are fetched again before a new kernel is resolved.
const LISTS_MAX_AGE_S: u64 = 24 * 3600;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Archive {
    Main,
    Security,
}

/// The private apt configuration and its state directory.
pub struct Apt {
    root: PathBuf,
    config: PathBuf,
}

impl Apt {
    /// Writes the configuration (idempotent) under `root`.
    pub fn new(root: &Path) -> Result<Self> {
        let (main, security) = archive_uris()?;
        for dir in ["lists/partial", "archives/partial", "etc"] {
            std::fs::create_dir_all(root.join(dir)).with_context(|| format!("creating {}", root.display()))?;
        }
        let sources: String = SUITES
            .iter()
            .map(|(suite, archive)| {
                let uri = if *archive == Archive::Security { &security } else { &main };
                format!("deb [signed-by={KEYRING}] {uri} {suite} main\n")
            })
            .collect();
        std::fs::write(root.join("etc/sources.list"), sources)?;
        let r = root.display();
        let config = root.join("etc/apt.conf");
        std::fs::write(
            &config,
            format!(
                "Dir::State \"{r}\";\nDir::State::Lists \"{r}/lists\";\nDir::State::status \"/dev/null\";\n\
                 Dir::Cache \"{r}\";\nDir::Etc::SourceList \"{r}/etc/sources.list\";\n\
                 Dir::Etc::SourceParts \"/nonexistent\";\nAPT::Architecture \"amd64\";\n\
                 Acquire::Languages \"none\";\nAPT::Sandbox::User \"root\";\n"
            ),
        )?;
        Ok(Self { root: root.to_path_buf(), config })
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("APT_CONFIG", &self.config);
        cmd
    }

    /// `apt-get update` of the private lists, when they are missing or a day old.
    pub fn update(&self) -> Result<()> {
        let stamp = self.root.join("lists/.updated");
        let fresh = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() < LISTS_MAX_AGE_S));
        if fresh {
            return Ok(());
        }
        shell::run(self.command("apt-get").args(["update", "-q"]).stdout(std::process::Stdio::null()))
            .context("fetching the package lists of Debian's kernel suites")?;
        std::fs::write(stamp, "")?;
        Ok(())
    }

    /// The newest generic amd64 image of `kernel`'s series: package names
    /// `linux-image-<series>.<n>[-<abi>][+debN]-amd64` (no cloud, rt, dbg or
    /// unsigned flavour, no backport to an older release).
    pub fn resolve(&self, kernel: &Kernel) -> Result<(String, String)> {
        let prefix = format!("linux-image-{}.", kernel.series);
        let names = shell::output(self.command("apt-cache").args(["pkgnames", &prefix]))?;
        let mut best: Option<(String, String)> = None;
        for name in names.lines().filter(|n| generic_image(n, &prefix)) {
            let version = self.version(name)?;
            let newer = match &best {
                None => true,
                Some((_, v)) => shell::succeeds(Command::new("dpkg").args(["--compare-versions", &version, "gt", v])),
            };
            if newer {
                best = Some((name.to_string(), version));
            }
        }
        best.with_context(|| format!("no generic amd64 image of Linux {} in Debian's archive", kernel.series))
    }

    fn version(&self, package: &str) -> Result<String> {
        let out = shell::output(self.command("apt-cache").args(["show", "--no-all-versions", package]))?;
        field(&out, "Version").with_context(|| format!("`apt-cache show {package}` has no Version"))
    }

    /// Downloads `package` and, from 6.19 on, the `linux-binary-*` and
    /// `linux-modules-*` packages the image is split into; returns the .debs.
    pub fn download(&self, package: &str, into: &Path) -> Result<Vec<PathBuf>> {
        let show = shell::output(self.command("apt-cache").args(["show", "--no-all-versions", package]))?;
        let depends = field(&show, "Depends").unwrap_or_default();
        let parts = depends
            .split(',')
            .filter_map(|d| d.split_whitespace().next())
            .filter(|d| d.starts_with("linux-binary-") || d.starts_with("linux-modules-"));
        let packages: Vec<String> = std::iter::once(package.to_string()).chain(parts.map(String::from)).collect();
        std::fs::create_dir_all(into)?;
        shell::run(self.command("apt-get").current_dir(into).args(["download", "-q"]).args(&packages))
            .with_context(|| format!("downloading {}", packages.join(", ")))?;
        let mut debs = Vec::new();
        for entry in std::fs::read_dir(into)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if packages.iter().any(|p| name.starts_with(&format!("{p}_"))) && name.ends_with(".deb") {
                debs.push(path);
            }
        }
        if debs.len() != packages.len() {
            bail!(
                "downloaded {} of {} packages ({}) into {}",
                debs.len(),
                packages.len(),
                packages.join(", "),
                into.display()
            );
        }
        Ok(debs)
    }
}

fn generic_image(name: &str, prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_suffix("-amd64")) else { return false };
    // `<n>`, `<n>-<abi>` (5.10.0-46) or `<n>+deb<N>` (6.12.117+deb13).
    let (n, tail) = rest.split_once(['-', '+']).unwrap_or((rest, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(n) && (tail.is_empty() || digits(tail) || tail.strip_prefix("deb").is_some_and(digits))
}

fn field(stanza: &str, name: &str) -> Option<String> {
    stanza.lines().find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_string))
}

/// The archive's URIs as the machine's apt has them: the main archive and
/// the security archive (`…-security`).
fn archive_uris() -> Result<(String, String)> {
    let mut uris = Vec::new();
    for file in HOST_SOURCES {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        for line in text.lines() {
            let line = line.trim();
            if let Some(list) = line.strip_prefix("URIs:") {
                uris.extend(list.split_whitespace().map(str::to_string));
            } else if let Some(rest) = line.strip_prefix("deb ") {
                // One-line format: `deb [options] URI suite components`.
                let rest = if rest.starts_with('[') { rest.split_once(']').map_or("", |(_, r)| r) } else { rest };
                uris.extend(rest.split_whitespace().next().map(str::to_string));
            }
        }
    }
    let security = uris.iter().find(|u| u.trim_end_matches('/').ends_with("-security")).cloned();
    let main = uris.iter().find(|u| u.trim_end_matches('/').ends_with("/debian")).cloned();
    match (main, security) {
        (Some(main), Some(security)) => Ok((main, security)),
        _ => bail!(
            "no Debian archive URIs (…/debian and …/debian-security) in {}: the kernel matrix fetches Debian's \
             kernels from the archive this machine's apt uses",
            HOST_SOURCES.join(" or ")
        ),
    }
}

/// Unpacks `.deb`s into `dir` (`dpkg-deb -x`).
pub fn extract(debs: &[PathBuf], dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for deb in debs {
        shell::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::generic_image;

    #[test]
    fn only_generic_images_of_the_series() {
        let p = "linux-image-6.1.";
        assert!(generic_image("linux-image-6.1.0-50-amd64", p));
        assert!(!generic_image("linux-image-6.1.0-0.deb11.52-amd64", p));
        assert!(!generic_image("linux-image-6.1.0-50-cloud-amd64", p));
        assert!(!generic_image("linux-image-6.1.0-50-amd64-dbg", p));
        assert!(generic_image("linux-image-6.12.117+deb13-amd64", "linux-image-6.12."));
        assert!(!generic_image("linux-image-6.12.117+deb13-amd64", p));
        assert!(generic_image("linux-image-7.2.13+deb14-amd64", "linux-image-7.2."));
    }
}
