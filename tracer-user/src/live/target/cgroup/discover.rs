//! Finding where ttrace's own cgroup is in each mounted hierarchy
//! (/proc/self/mountinfo and /proc/self/cgroup), and whether cgroup v2 can
//! give a child the memory controller.

use std::{
    fs,
    path::{Path, PathBuf},
};

use super::{CgroupError, CgroupVersion, read_text};

/// Where the memory controller is: the chosen (version, parent, root), why
/// v2 was skipped, and every usable parent (for stale-cgroup cleanup).
pub(super) struct Placement {
    pub chosen: (CgroupVersion, PathBuf, PathBuf),
    pub why_not_v2: Option<String>,
    pub parents: Vec<PathBuf>,
}

impl Placement {
    /// `prepare` enables the v2 memory controller for children if needed;
    /// without it a v2 parent that lacks it is simply not chosen.
    pub fn find(prepare: bool) -> Result<Placement, CgroupError> {
        let mountinfo = read_text(Path::new("/proc/self/mountinfo"))?;
        let own = read_text(Path::new("/proc/self/cgroup"))?;
        let mounts = parse_mountinfo(&mountinfo);
        let own = parse_proc_cgroup(&own);
        let v2 = own_dir(&mounts, &own, CgroupVersion::V2).and_then(|(parent, root)| {
            prepare_v2(&parent, prepare)?;
            Ok((parent, root))
        });
        let v1 = own_dir(&mounts, &own, CgroupVersion::V1);
        let parents = [&v2, &v1].iter().filter_map(|r| r.as_ref().ok().map(|(p, _)| p.clone())).collect();
        match (v2, v1) {
            (Ok((p, r)), _) => Ok(Placement { chosen: (CgroupVersion::V2, p, r), why_not_v2: None, parents }),
            (Err(why), Ok((p, r))) => {
                Ok(Placement { chosen: (CgroupVersion::V1, p, r), why_not_v2: Some(why), parents })
            }
            (Err(v2), Err(v1)) => Err(CgroupError::NoMemoryController { v2, v1 }),
        }
    }
}

/// Makes sure children of the v2 cgroup `parent` get the memory controller.
fn prepare_v2(parent: &Path, enable: bool) -> Result<(), String> {
    let controllers = fs::read_to_string(parent.join("cgroup.controllers"))
        .map_err(|e| format!("cannot read {}/cgroup.controllers: {e}", parent.display()))?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return Err(format!(
            "{} does not offer the memory controller (cgroup.controllers: {:?}); \
             it is bound to a v1 hierarchy or not delegated",
            parent.display(),
            controllers.trim()
        ));
    }
    let subtree = parent.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&subtree).map_err(|e| format!("cannot read {}: {e}", subtree.display()))?;
    if enabled.split_whitespace().any(|c| c == "memory") {
        return Ok(());
    }
    if !enable {
        return Err(format!("memory is not enabled in {}", subtree.display()));
    }
    // Left enabled afterwards: turning it off again would take the
    // controller from sibling cgroups (e.g. another ttrace run).
    fs::write(&subtree, "+memory").map_err(|e| {
        format!(
            "cannot enable memory in {}: {e} (v2 allows it only in cgroups holding no processes)",
            subtree.display()
        )
    })
}

/// The memory cgroup process `pid` is charged to: (version, its directory,
/// the hierarchy's mount point). v2 when its cgroup there accounts memory
/// (has `memory.current`), else the v1 `memory` hierarchy.
pub(super) fn of_process(pid: u32) -> Option<(CgroupVersion, PathBuf, PathBuf)> {
    let mounts = parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").ok()?);
    let own = parse_proc_cgroup(&fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?);
    if let Ok((dir, root)) = own_dir(&mounts, &own, CgroupVersion::V2)
        && dir.join("memory.current").exists()
    {
        return Some((CgroupVersion::V2, dir, root));
    }
    let (dir, root) = own_dir(&mounts, &own, CgroupVersion::V1).ok()?;
    Some((CgroupVersion::V1, dir, root))
}

struct Mount {
    root: String,
    point: PathBuf,
    fstype: String,
    super_opts: String,
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let fstype = post.next()?.to_string();
            let super_opts = post.nth(1).unwrap_or("").to_string();
            Some(Mount { root: unescape(pre.get(3)?), point: PathBuf::from(unescape(pre.get(4)?)), fstype, super_opts })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/proc/self/cgroup` lines: (controllers, path); v2 has no controllers.
fn parse_proc_cgroup(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let ctrls = parts.next()?;
            let path = parts.next()?;
            let ctrls = ctrls.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect();
            Some((ctrls, path.to_string()))
        })
        .collect()
}

/// The cgroup directory that `own` (a `/proc/PID/cgroup`) names in the
/// hierarchy `version` (for v1, the one with the memory controller), and
/// that hierarchy's mount point.
fn own_dir(
    mounts: &[Mount],
    own: &[(Vec<String>, String)],
    version: CgroupVersion,
) -> Result<(PathBuf, PathBuf), String> {
    let (mount, path) = match version {
        CgroupVersion::V2 => {
            let mount = mounts.iter().find(|m| m.fstype == "cgroup2").ok_or("no cgroup2 file system is mounted")?;
            let path = own.iter().find(|(c, _)| c.is_empty()).ok_or("/proc/self/cgroup has no cgroup2 line")?;
            (mount, &path.1)
        }
        CgroupVersion::V1 => {
            let mount = mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == "memory"))
                .ok_or("no cgroup v1 hierarchy with the memory controller is mounted")?;
            let path = own
                .iter()
                .find(|(c, _)| c.iter().any(|c| c == "memory"))
                .ok_or("/proc/self/cgroup has no memory line")?;
            (mount, &path.1)
        }
    };
    // Inside a cgroup namespace or a bind mount, the mount shows a subtree.
    let rel = if mount.root == "/" {
        path.as_str()
    } else {
        path.strip_prefix(mount.root.as_str())
            .ok_or_else(|| format!("our cgroup {path} is outside the mounted subtree {}", mount.root))?
    };
    let rel = rel.trim_start_matches('/');
    let dir = if rel.is_empty() { mount.point.clone() } else { mount.point.join(rel) };
    if !dir.join("cgroup.procs").exists() {
        return Err(format!("our cgroup directory {} does not exist", dir.display()));
    }
    Ok((dir, mount.point.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_and_proc_cgroup() {
        let mi = "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                  31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n\
                  32 25 0:28 /sub /mnt/my\\040cg rw - cgroup cgroup rw,cpu,memory\n";
        let m = parse_mountinfo(mi);
        assert_eq!(m.len(), 3);
        assert_eq!(m[2].point, PathBuf::from("/mnt/my cg"));
        assert_eq!(m[2].root, "/sub");
        let own = parse_proc_cgroup("4:memory:/a/b\n0::/\n1:cpu,cpuacct:/\n");
        assert_eq!(own[0], (vec!["memory".to_string()], "/a/b".to_string()));
        assert_eq!(own[1], (vec![], "/".to_string()));
        assert_eq!(own[2].0, vec!["cpu", "cpuacct"]);
    }

    #[test]
    fn own_dir_and_v2_preparation() {
        let tmp = std::env::temp_dir().join(format!("ttrace-cgroup-unit-{}", std::process::id()));
        let sub = tmp.join("a/b");
        fs::create_dir_all(&sub).unwrap();
        for d in [&tmp, &sub] {
            fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        let point = tmp.to_string_lossy();
        // A cgroup2 mount showing the subtree /ns of the hierarchy.
        let mounts = parse_mountinfo(&format!("1 0 0:1 /ns {point} rw - cgroup2 cgroup2 rw\n"));
        let own = parse_proc_cgroup("0::/ns/a/b\n");
        assert_eq!(own_dir(&mounts, &own, CgroupVersion::V2).unwrap(), (sub.clone(), tmp.clone()));
        let own = parse_proc_cgroup("0::/ns\n");
        assert_eq!(own_dir(&mounts, &own, CgroupVersion::V2).unwrap().0, tmp);
        let outside = own_dir(&mounts, &parse_proc_cgroup("0::/other\n"), CgroupVersion::V2).unwrap_err();
        assert!(outside.contains("outside the mounted subtree"), "{outside}");
        let v1 = own_dir(&mounts, &parse_proc_cgroup("0::/ns\n"), CgroupVersion::V1).unwrap_err();
        assert!(v1.contains("no cgroup v1 hierarchy"), "{v1}");

        fs::write(sub.join("cgroup.controllers"), "cpu io hugetlb\n").unwrap();
        assert!(prepare_v2(&sub, true).unwrap_err().contains("does not offer the memory controller"));
        fs::write(sub.join("cgroup.controllers"), "cpu memory\n").unwrap();
        fs::write(sub.join("cgroup.subtree_control"), "cpu\n").unwrap();
        assert!(prepare_v2(&sub, false).unwrap_err().contains("not enabled"));
        prepare_v2(&sub, true).unwrap();
        assert_eq!(fs::read_to_string(sub.join("cgroup.subtree_control")).unwrap(), "+memory");
        fs::write(sub.join("cgroup.subtree_control"), "memory cpu\n").unwrap();
        prepare_v2(&sub, false).unwrap();
        fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn unescapes() {
        assert_eq!(unescape("a\\040b\\134"), "a b\\");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }
}
