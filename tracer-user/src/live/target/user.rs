//! The user `ttrace run` starts the program as. ttrace runs as root (via
//! sudo) to trace; the traced program should not, unless asked.

use std::{ffi::CString, path::PathBuf};

use nix::unistd::{Gid, Uid, User, getgrouplist};

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
    let (found, label) = match key {
        Key::Name(name) => (User::from_name(name), name.to_string()),
        Key::Uid(uid) => (User::from_uid(Uid::from_raw(uid)), format!("uid {uid}")),
    };
    let user = found.map_err(|e| TargetError::UserLookup { name: label, source: std::io::Error::from(e) })?;
    Ok(user.map(|u| {
        let (uid, gid) = (u.uid.as_raw(), u.gid.as_raw());
        let groups = group_list(&u.name, gid);
        UserSpec { name: u.name, uid, gid, groups, home: u.dir }
    }))
}

/// The groups initgroups(name, gid) would set; read before fork because
/// initgroups is not async-signal-safe.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = CString::new(name) else { return vec![gid] };
    match getgrouplist(&cname, Gid::from_raw(gid)) {
        Ok(groups) => groups.into_iter().map(Gid::as_raw).collect(),
        Err(_) => vec![gid],
    }
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
