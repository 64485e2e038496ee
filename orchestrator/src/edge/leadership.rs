//! Who acts (DESIGN.md 15): exactly one orchestrator commands the agents.
//!
//! On a SQLite journal that is the file's one owner ([`Role::Sole`]). On
//! etcd several orchestrators run and one is elected on a lease
//! (`edge::election`); the others are followers: they serve `status` and
//! `history` from the shared journal, answer every mutating call and every
//! agent with the leader's address, and command nothing.
//!
//! A leader's fencing token is the etcd revision at which it took the
//! leadership. It goes on every command it sends; an agent remembers the
//! highest it has seen and refuses a lower one, so a deposed leader's late
//! command (a process that was paused, or partitioned, past its lease) is
//! refused where it would do harm, whatever that leader believes.
//!
//! This is the one place the rest of the orchestrator asks; the election
//! writes it.

use std::sync::Arc;

use tokio::sync::watch;

use pdwarden_model::status::Role;

/// The shared view of [`Role`]: cheap to clone, read by the fleet and the
/// control service, written by the election.
#[derive(Clone)]
pub struct Leadership {
    role: Arc<watch::Sender<Role>>,
    /// The URL this orchestrator advertises (absent on SQLite).
    pub advertise_url: Option<String>,
    /// How long a follower holds an agent that lost the leader it would
    /// name, waiting for the next one ([`Leadership::leader_for`]).
    pub follower_hold: std::time::Duration,
}

impl Leadership {
    /// The one orchestrator of a SQLite journal.
    pub fn sole() -> Self {
        Self {
            role: Arc::new(watch::Sender::new(Role::Sole)),
            advertise_url: None,
            follower_hold: std::time::Duration::ZERO,
        }
    }

    /// An orchestrator of an etcd journal, before its first election;
    /// `follower_hold` as the field says (about two leases).
    pub fn candidate(advertise_url: impl Into<String>, follower_hold: std::time::Duration) -> Self {
        Self {
            role: Arc::new(watch::Sender::new(Role::Follower {
                leader_url: None,
                why: "starting: not yet in touch with etcd".into(),
            })),
            advertise_url: Some(advertise_url.into()),
            follower_hold,
        }
    }

    /// The leader a follower names to an agent, and when. Named at once
    /// when one is known and it is not `lost` (the leader the agent's last
    /// stream broke with: most likely dead, its lease not lapsed yet);
    /// otherwise this waits — at most `follower_hold` — until another
    /// leads (this one included), so the agent goes straight to the new
    /// leader when it is elected. Past the hold: whatever is known (empty:
    /// none).
    pub async fn leader_for(&self, lost: &str) -> String {
        let mut rx = self.role.subscribe();
        let deadline = tokio::time::sleep(self.follower_hold);
        tokio::pin!(deadline);
        loop {
            let known = match &*rx.borrow_and_update() {
                Role::Leader { .. } => self.advertise_url.clone(),
                Role::Follower {
                    leader_url: Some(url), ..
                } => Some(url.clone()),
                _ => None,
            };
            match known {
                Some(url) if lost.is_empty() || url.trim_end_matches('/') != lost.trim_end_matches('/') => {
                    return url;
                }
                _ => {}
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return known.unwrap_or_default() },
                () = &mut deadline => return known.unwrap_or_default(),
            }
        }
    }

    pub fn role(&self) -> Role {
        self.role.borrow().clone()
    }

    pub fn set(&self, role: Role) {
        self.role.send_replace(role);
    }

    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.role.subscribe()
    }

    /// Whether this orchestrator may command agents and start operations.
    pub fn leads(&self) -> bool {
        matches!(*self.role.borrow(), Role::Sole | Role::Leader { .. })
    }

    /// The token to stamp on a command: 0 for a sole orchestrator (and,
    /// never sent, for a follower).
    pub fn token(&self) -> u64 {
        match *self.role.borrow() {
            Role::Leader { token, .. } => token,
            _ => 0,
        }
    }

    /// Why a mutating call is not taken here, naming the leader: `None`
    /// when this orchestrator leads.
    pub fn refusal(&self) -> Option<String> {
        match self.role() {
            Role::Sole | Role::Leader { .. } => None,
            Role::Follower {
                leader_url: Some(url),
                why,
            } => Some(format!(
                "this orchestrator ({}) is a follower ({why}); the leader is {url}: run the command against it (--orchestrator {url})",
                self.advertise_url.as_deref().unwrap_or("?")
            )),
            Role::Follower { leader_url: None, why } => Some(format!(
                "no orchestrator leads right now ({why}); nothing was started: retry once one leads (`pdwarden status` says which)"
            )),
        }
    }
}

impl Default for Leadership {
    fn default() -> Self {
        Self::sole()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a leader (or the sole orchestrator) acts, and a follower's
    /// refusal names the leader it knows, or says none leads.
    #[test]
    fn a_follower_refuses_naming_the_leader() {
        let l = Leadership::candidate("http://b:7070", std::time::Duration::from_secs(4));
        assert!(!l.leads());
        assert!(l.refusal().unwrap().contains("no orchestrator leads"));
        l.set(Role::Follower {
            leader_url: Some("http://a:7070".into()),
            why: "http://a:7070 holds the lease".into(),
        });
        let said = l.refusal().unwrap();
        assert!(said.contains("(http://b:7070) is a follower"), "{said}");
        assert!(said.contains("--orchestrator http://a:7070"), "{said}");
        assert_eq!(l.token(), 0);
        l.set(Role::Leader {
            token: 42,
            since_unix_ms: 1,
        });
        assert!(l.leads() && l.refusal().is_none());
        assert_eq!(l.token(), 42);
        assert!(Leadership::sole().leads());
        assert_eq!(Leadership::sole().token(), 0);
    }

    /// A follower names the leader at once, unless it is the one the agent
    /// just lost: then it holds the agent until the next leader is elected
    /// (or this follower is), and past its hold names what it knows.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn an_agent_that_lost_the_leader_is_held_until_the_next_one() {
        let l = Leadership::candidate("http://b:7070", std::time::Duration::from_secs(4));
        let follow = |url: &str| Role::Follower {
            leader_url: Some(url.into()),
            why: "x".into(),
        };
        l.set(follow("http://a:7070"));
        assert_eq!(l.leader_for("").await, "http://a:7070");
        assert_eq!(l.leader_for("http://c:7070").await, "http://a:7070");
        // Lost a: held until c leads.
        let held = tokio::spawn({
            let l = l.clone();
            async move { l.leader_for("http://a:7070/").await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!held.is_finished(), "not sent back to the leader it lost");
        l.set(Role::Follower {
            leader_url: None,
            why: "a's lease lapsed".into(),
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!held.is_finished(), "nor away while none leads");
        l.set(follow("http://c:7070"));
        assert_eq!(held.await.unwrap(), "http://c:7070");
        // This one elected: it names itself.
        l.set(follow("http://a:7070"));
        let held = tokio::spawn({
            let l = l.clone();
            async move { l.leader_for("http://a:7070").await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        l.set(Role::Leader {
            token: 9,
            since_unix_ms: 0,
        });
        assert_eq!(held.await.unwrap(), "http://b:7070");
        // Past the hold, what is known (a live leader the agent could not reach).
        l.set(follow("http://a:7070"));
        let start = tokio::time::Instant::now();
        assert_eq!(l.leader_for("http://a:7070").await, "http://a:7070");
        assert_eq!(start.elapsed(), std::time::Duration::from_secs(4));
    }
}
