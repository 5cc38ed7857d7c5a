//! Debian roots made by debootstrap from Debian's archive, cached in the
//! set-up cache: the clean system `dist --verify` installs the .deb into,
//! and sid with its packaged llama.cpp, run as a container runs it. The
//! machine's own apt sources are only read, for the archive's address.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Result, bail};

use crate::shell;

/// `root`, a minbase SUITE with the packages INCLUDE names, made once. A
/// stamp written last marks a finished debootstrap: a directory without it
/// (an interrupted one) is made anew.
pub fn ensure(root: &Path, suite: &str, include: &str) -> Result<PathBuf> {
    let stamp = root.join(".ttrace-root");
    let wanted = format!("{suite} minbase {include}\n");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        return Ok(root.to_path_buf());
    }
    if !shell::succeeds(Command::new("debootstrap").arg("--version")) {
        shell::run(Command::new("apt-get").args(["install", "-y", "-q", "--no-install-recommends", "debootstrap"]))?;
    }
    let _ = std::fs::remove_dir_all(root);
    let mirror = debian_mirror(suite)?;
    eprintln!("debootstrap {suite} (minbase, with {include}) into {} from {mirror}", root.display());
    let t = Instant::now();
    shell::run(
        Command::new("debootstrap")
            .args(["--variant=minbase", &format!("--include={include}"), suite])
            .arg(root)
            .arg(&mirror)
            .stdout(std::io::stderr()),
    )?;
    std::fs::write(&stamp, wanted)?;
    eprintln!("debootstrap took {:.0}s", t.elapsed().as_secs_f64());
    Ok(root.to_path_buf())
}

/// The archive this machine's apt uses: its entry for SUITE, or else its
/// first main archive (every suite is under the same address; security
/// updates are not).
fn debian_mirror(suite: &str) -> Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.push(PathBuf::from("/etc/apt/sources.list"));
    let mut entries = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        if file.extension().is_some_and(|e| e == "sources") {
            entries.extend(deb822_entries(&text));
        } else {
            entries.extend(list_entries(&text));
        }
    }
    let of_suite = entries.iter().find(|(_, suites)| suites.iter().any(|s| s == suite));
    let main = entries.iter().find(|(uri, suites)| !uri.contains("security") && !suites.is_empty());
    match of_suite.or(main) {
        Some((uri, _)) => Ok(uri.clone()),
        None => bail!(
            "no Debian `deb` source in /etc/apt/sources.list or /etc/apt/sources.list.d to debootstrap {suite} \
             from: add one or make the root by hand"
        ),
    }
}

/// `(first URI, suites)` of each stanza with `Types: deb`.
fn deb822_entries(text: &str) -> Vec<(String, Vec<String>)> {
    text.split("\n\n")
        .filter_map(|stanza| {
            let field = |name: &str| {
                stanza.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).map(str::trim).unwrap_or_default()
            };
            field("Types").split_whitespace().any(|t| t == "deb").then_some(())?;
            let uri = field("URIs").split_whitespace().next()?.to_string();
            Some((uri, field("Suites").split_whitespace().map(str::to_string).collect()))
        })
        .collect()
}

/// `deb [options] URI SUITE components…`
fn list_entries(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "deb").then_some(())?;
            let mut words = words.skip_while(|w| w.starts_with('[')).skip_while(|w| !w.contains("://"));
            let uri = words.next()?.to_string();
            Some((uri, vec![words.next()?.to_string()]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_in_both_formats() {
        let deb822 = "Types: deb\nURIs: http://a.example/debian\nSuites: bookworm bookworm-updates\n\n\
                      Types: deb\nURIs: http://a.example/debian-security\nSuites: bookworm-security\n";
        let entries = deb822_entries(deb822);
        assert_eq!(entries[0], ("http://a.example/debian".into(), vec!["bookworm".into(), "bookworm-updates".into()]));
        let list = "deb [signed-by=/k.gpg] http://b.example/debian sid main\n# deb http://c sid\n";
        assert_eq!(list_entries(list), [("http://b.example/debian".into(), vec!["sid".into()])]);
    }
}
