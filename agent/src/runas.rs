//! Which user a unit runs as (issue 48, item 5: least privilege).
//!
//! A unit's `user` (and optional `group`) names an account of the host's
//! user database, by name or number. It is resolved to a uid and gid when
//! the agent loads its config ([`crate::AgentConfig::check_unit_users`]),
//! so that a typo or a missing account is one line naming the field at
//! start, and again at each spawn (an account removed since is refused
//! then, never run as the agent's own user instead).
//!
//! The spawn sets the child's gid, then its uid, and empties its
//! supplementary groups (`std::process::Command::uid`/`gid`; the workspace
//! forbids the `unsafe` a `pre_exec` would need to set the user's own
//! list). Dropping from root to another uid clears every capability of the
//! child: an engine that runs someone's code (`trust_remote_code`) runs it
//! as its user, with no privilege over the agent, its keys or other users'
//! files. `HOME`, `USER` and `LOGNAME` are the account's unless the unit's
//! `env` sets them.
//!
//! Only a root agent with `CAP_SETUID` and `CAP_SETGID` switches users. A
//! non-root agent is refused at load for a unit of another user: it cannot
//! switch (and one given the capabilities as ambient ones would hand them
//! to the unit, whose uid change from a non-root uid keeps them).

use std::path::PathBuf;

use nix::unistd::{Gid, Group, Uid, User};

/// The account a unit runs as, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// The account's name (for `USER`, `LOGNAME` and messages).
    pub user: String,
    pub uid: u32,
    /// `group`'s gid when set, else the account's primary group.
    pub gid: u32,
    /// The account's home directory (`HOME`).
    pub home: PathBuf,
}

impl RunAs {
    /// `user (uid U, gid G)`, for messages.
    pub fn describe(&self) -> String {
        format!("{} (uid {}, gid {})", self.user, self.uid, self.gid)
    }
}

/// What the agent process itself may do about users.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Privilege {
    /// The agent's effective uid and gid.
    pub uid: u32,
    pub gid: u32,
    /// Effective `CAP_SETUID` and `CAP_SETGID` (both).
    pub setid_capable: bool,
}

/// Bits of `CapEff` in /proc/self/status (linux/capability.h).
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

impl Privilege {
    /// This process's, read from the kernel (effective ids) and
    /// /proc/self/status (`CapEff`; unreadable: no capability assumed).
    pub fn of_this_process() -> Privilege {
        let caps = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(0);
        Privilege {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            setid_capable: caps & (1 << CAP_SETUID) != 0 && caps & (1 << CAP_SETGID) != 0,
        }
    }

    /// Whether this agent can start a process as `to`, and why not: the
    /// agent's own uid and gid need no switch; another needs a root agent
    /// with `CAP_SETUID` and `CAP_SETGID`.
    pub fn may_run_as(&self, to: &RunAs) -> Result<(), String> {
        if to.uid == self.uid && to.gid == self.gid {
            return Ok(());
        }
        if self.uid != 0 {
            return Err(format!(
                "the agent runs as uid {}, not root: it cannot start a unit as {}; run the agent as root \
                 (the packaged unit does) or leave `user` and `group` out",
                self.uid,
                to.describe()
            ));
        }
        if !self.setid_capable {
            return Err(format!(
                "the agent lacks CAP_SETUID or CAP_SETGID: it cannot start a unit as {}; keep both in the \
                 agent's CapabilityBoundingSet (deploy/systemd/pdwarden-agent.service)",
                to.describe()
            ));
        }
        Ok(())
    }
}

/// A user by name, else by number; `Err` says what is wrong in one line.
fn lookup_user(spec: &str) -> Result<User, String> {
    let by_name = User::from_name(spec).map_err(|e| format!("cannot look up user {spec:?}: {e}"))?;
    if let Some(user) = by_name {
        return Ok(user);
    }
    if let Ok(uid) = spec.parse::<u32>()
        && let Some(user) = User::from_uid(Uid::from_raw(uid)).map_err(|e| format!("cannot look up uid {uid}: {e}"))?
    {
        return Ok(user);
    }
    Err(format!("no such user {spec:?} on this host"))
}

/// A group by name, else by number.
fn lookup_group(spec: &str) -> Result<Group, String> {
    let by_name = Group::from_name(spec).map_err(|e| format!("cannot look up group {spec:?}: {e}"))?;
    if let Some(group) = by_name {
        return Ok(group);
    }
    if let Ok(gid) = spec.parse::<u32>()
        && let Some(group) =
            Group::from_gid(Gid::from_raw(gid)).map_err(|e| format!("cannot look up gid {gid}: {e}"))?
    {
        return Ok(group);
    }
    Err(format!("no such group {spec:?} on this host"))
}

/// Which setting is at fault in a [`resolve`] error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    User,
    Group,
}

impl Field {
    /// The unit's config field: `user` or `group`.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::User => "user",
            Field::Group => "group",
        }
    }
}

/// `user` and `group` as the host's database has them now; `None` when
/// `user` is absent (the unit runs as the agent does). The error names the
/// field at fault and says why, in one line.
pub fn resolve(user: Option<&str>, group: Option<&str>) -> Result<Option<RunAs>, (Field, String)> {
    let Some(user) = user else {
        return Ok(None);
    };
    let account = lookup_user(user).map_err(|e| (Field::User, e))?;
    let gid = match group {
        Some(group) => lookup_group(group).map_err(|e| (Field::Group, e))?.gid,
        None => account.gid,
    };
    Ok(Some(RunAs {
        user: account.name,
        uid: account.uid.as_raw(),
        gid: gid.as_raw(),
        home: account.dir,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nobody() -> RunAs {
        resolve(Some("nobody"), None)
            .unwrap()
            .expect("nobody is in every user database")
    }

    // Property: a user resolves by name or by number to the same account,
    // with its primary group unless `group` names another; a name that is
    // not there is an error naming the field and the name.
    #[test]
    fn users_and_groups_resolve_by_name_or_number() {
        let n = nobody();
        assert_eq!(n.user, "nobody");
        assert_eq!(resolve(Some(&n.uid.to_string()), None).unwrap(), Some(n.clone()));
        let root_group = resolve(Some("nobody"), Some("0")).unwrap().unwrap();
        assert_eq!((root_group.uid, root_group.gid), (n.uid, 0));
        assert_eq!(resolve(None, None).unwrap(), None);
        let (field, why) = resolve(Some("pdwarden-no-such-user"), None).unwrap_err();
        assert_eq!(field, Field::User);
        assert_eq!(why, "no such user \"pdwarden-no-such-user\" on this host");
        let (field, why) = resolve(Some("nobody"), Some("pdwarden-no-such-group")).unwrap_err();
        assert_eq!(field, Field::Group);
        assert_eq!(why, "no such group \"pdwarden-no-such-group\" on this host");
        assert_eq!(resolve(Some("4000000000"), None).unwrap_err().0, Field::User);
    }

    // Property: only a root agent with both capabilities switches; the
    // agent's own uid and gid need no switch, whoever the agent is.
    #[test]
    fn only_a_capable_root_agent_switches_users() {
        let n = nobody();
        let root = Privilege {
            uid: 0,
            gid: 0,
            setid_capable: true,
        };
        assert_eq!(root.may_run_as(&n), Ok(()));
        let unprivileged = Privilege {
            uid: 1000,
            gid: 1000,
            setid_capable: false,
        };
        let e = unprivileged.may_run_as(&n).unwrap_err();
        assert!(
            e.starts_with("the agent runs as uid 1000, not root: it cannot start a unit as nobody"),
            "{e}"
        );
        // Capabilities without root are not enough (they would pass to the unit).
        let capable = Privilege {
            setid_capable: true,
            ..unprivileged
        };
        assert!(capable.may_run_as(&n).is_err());
        let capless_root = Privilege {
            setid_capable: false,
            ..root
        };
        assert!(
            capless_root
                .may_run_as(&n)
                .unwrap_err()
                .contains("lacks CAP_SETUID or CAP_SETGID")
        );
        let itself = Privilege {
            uid: n.uid,
            gid: n.gid,
            setid_capable: false,
        };
        assert_eq!(itself.may_run_as(&n), Ok(()));
    }
}
