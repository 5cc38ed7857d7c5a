//! The user `ttrace run` starts the program as. ttrace runs as root (via
//! sudo) to trace; the traced program should not, unless asked.

use std::{
    ffi::{CStr, CString, OsStr},
    os::unix::ffi::OsStrExt,
    path::PathBuf,
};

use super::TargetError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSpec {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, as initgroups would set them.
    pub groups: Vec<u32>,
    pub home: PathBuf,
}

impl UserSpec {
    /// The user for `ttrace run`: `--user NAME` when given; else, when root
    /// under sudo, the user who ran sudo; else `None`: keep the current user.
    pub fn for_run(explicit: Option<&str>) -> Result<Option<Self>, TargetError> {
        if let Some(name) = explicit {
            return Self::by_name(name).map(Some);
        }
        if crate::live::privileges::is_root() { Self::from_sudo_env() } else { Ok(None) }
    }

    /// The invoking user from sudo's `SUDO_UID`/`SUDO_GID`/`SUDO_USER`;
    /// `None` when not under sudo or when sudo was run by root.
    pub fn from_sudo_env() -> Result<Option<Self>, TargetError> {
        let var = |k| std::env::var(k).ok();
        Self::from_sudo_vars(var("SUDO_USER").as_deref(), var("SUDO_UID").as_deref(), var("SUDO_GID").as_deref())
    }

    pub fn from_sudo_vars(
        user: Option<&str>,
        uid: Option<&str>,
        gid: Option<&str>,
    ) -> Result<Option<Self>, TargetError> {
        let Some(uid) = uid.and_then(|u| u.trim().parse::<u32>().ok()) else { return Ok(None) };
        if uid == 0 {
            return Ok(None);
        }
        let gid = gid.and_then(|g| g.trim().parse::<u32>().ok());
        let mut spec = match lookup(Key::Uid(uid))? {
            Some(spec) => spec,
            // A uid without a passwd entry (containers): what sudo told us.
            None => {
                let gid = gid.unwrap_or(uid);
                let name = user.map_or_else(|| uid.to_string(), str::to_string);
                Self { name, uid, gid, groups: vec![gid], home: PathBuf::from("/") }
            }
        };
        if let Some(gid) = gid
            && gid != spec.gid
        {
            spec.gid = gid;
            spec.groups = group_list(&spec.name, gid);
        }
        Ok(Some(spec))
    }

    /// A passwd entry by name, or by numeric uid when no name matches.
    pub fn by_name(name: &str) -> Result<Self, TargetError> {
        if let Some(spec) = lookup(Key::Name(name))? {
            return Ok(spec);
        }
        match name.parse::<u32>() {
            Ok(uid) => lookup(Key::Uid(uid))?,
            Err(_) => None,
        }
        .ok_or_else(|| TargetError::UnknownUser { name: name.to_string() })
    }

    pub fn by_uid(uid: u32) -> Result<Option<Self>, TargetError> {
        lookup(Key::Uid(uid))
    }
}

enum Key<'a> {
    Name(&'a str),
    Uid(u32),
}

fn lookup(key: Key<'_>) -> Result<Option<UserSpec>, TargetError> {
    let label = match &key {
        Key::Name(n) => n.to_string(),
        Key::Uid(u) => format!("uid {u}"),
    };
    let cname = match &key {
        Key::Name(n) => Some(CString::new(*n).map_err(|_| TargetError::UnknownUser { name: label.clone() })?),
        Key::Uid(_) => None,
    };
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: zeroed passwd is a valid out-parameter; pointers in it refer to `buf`.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let buf_ptr = buf.as_mut_ptr().cast::<libc::c_char>();
        // SAFETY: all pointers are valid for the call; buf.len() is its size.
        let rc = unsafe {
            match (&key, &cname) {
                (Key::Uid(uid), _) => libc::getpwuid_r(*uid, &mut pwd, buf_ptr, buf.len(), &mut result),
                (Key::Name(_), Some(c)) => libc::getpwnam_r(c.as_ptr(), &mut pwd, buf_ptr, buf.len(), &mut result),
                (Key::Name(_), None) => return Ok(None),
            }
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(TargetError::UserLookup { name: label, source: std::io::Error::from_raw_os_error(rc) });
        }
        if result.is_null() {
            return Ok(None);
        }
        // SAFETY: on success the strings are NUL-terminated inside `buf`.
        let (name, home) = unsafe { (CStr::from_ptr(pwd.pw_name), CStr::from_ptr(pwd.pw_dir)) };
        let name = name.to_string_lossy().into_owned();
        let groups = group_list(&name, pwd.pw_gid);
        let home = PathBuf::from(OsStr::from_bytes(home.to_bytes()));
        return Ok(Some(UserSpec { name, uid: pwd.pw_uid, gid: pwd.pw_gid, groups, home }));
    }
}

/// The groups initgroups(name, gid) would set; read before fork because
/// initgroups is not async-signal-safe.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = CString::new(name) else { return vec![gid] };
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    for _ in 0..8 {
        let mut n = libc::c_int::try_from(groups.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `groups` holds `n` entries; getgrouplist writes at most `n`.
        let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        let n = usize::try_from(n).unwrap_or(0);
        if rc >= 0 {
            groups.truncate(n);
            return groups;
        }
        groups.resize(n.max(groups.len() * 2), 0);
    }
    vec![gid]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_nobody_exist() {
        let root = UserSpec::by_uid(0).unwrap().unwrap();
        assert_eq!((root.name.as_str(), root.uid, root.gid), ("root", 0, 0));
        assert!(root.groups.contains(&0));
        let nobody = UserSpec::by_name("nobody").unwrap();
        assert_eq!(UserSpec::by_name(&nobody.uid.to_string()).unwrap(), nobody);
    }

    #[test]
    fn unknown_user_is_an_error() {
        let err = UserSpec::by_name("no-such-user-ttrace").unwrap_err();
        assert_eq!(err.to_string(), "no user `no-such-user-ttrace` in the passwd database (check --user)");
        assert!(UserSpec::by_name("a\0b").is_err());
    }

    #[test]
    fn sudo_vars() {
        assert_eq!(UserSpec::from_sudo_vars(None, None, None).unwrap(), None);
        assert_eq!(UserSpec::from_sudo_vars(Some("root"), Some("0"), Some("0")).unwrap(), None);
        let nobody = UserSpec::by_name("nobody").unwrap();
        let spec = UserSpec::from_sudo_vars(Some("x"), Some(&nobody.uid.to_string()), Some(&nobody.gid.to_string()))
            .unwrap()
            .unwrap();
        assert_eq!(spec, nobody);
        let ghost = UserSpec::from_sudo_vars(Some("ghost"), Some("4000123"), Some("4000124")).unwrap().unwrap();
        assert_eq!(
            (ghost.name.as_str(), ghost.uid, ghost.gid, ghost.groups.as_slice()),
            ("ghost", 4000123, 4000124, &[4000124][..])
        );
    }
}
