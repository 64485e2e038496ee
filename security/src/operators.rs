//! Who the operators are, as configured (issue 8): the `[[operator]]`
//! entries of the orchestrator config and their tokens.
//!
//! Tokens are configured by their SHA-256 only (`[[operator]] token_sha256`),
//! so the config file never holds a credential; `pdwarden certs token NAME`
//! mints one ([`new_token`], [`hash_token`]). Three roles, each allowed
//! what the one before it is: `read`, `forensics` (issue 48: also the
//! contents of evidence captures, which hold engines' argv, log tails,
//! metrics and stacks) and `operate`. The orchestrator's request check
//! (which method needs which role, and the gRPC middleware) is
//! `pdwarden_orchestrator::edge::auth`.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What an operator may do. Ordered: each role may do what the roles
/// before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OperatorRole {
    /// `status`, `history` (an evidence capture's existence and summary).
    Read,
    /// Also the contents of evidence captures (`history --evidence`),
    /// nothing that changes the fleet.
    Forensics,
    /// Also restart, verify, gate, restart unit.
    Operate,
}

impl OperatorRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Forensics => "forensics",
            Self::Operate => "operate",
        }
    }

    /// The role named `name` ([`OperatorRole::as_str`]'s words).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Read, Self::Forensics, Self::Operate]
            .into_iter()
            .find(|r| r.as_str() == name)
    }
}

/// One `[[operator]]` of the orchestrator config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// Recorded as the actor of everything this operator does.
    pub name: String,
    pub role: OperatorRole,
    /// Lower-case hex SHA-256 of the token (`pdwarden certs token NAME` prints both).
    pub token_sha256: String,
}

/// Lower-case hex SHA-256 of a token.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh token: `pdw_` and 244 random bits (two v4 UUIDs, from the OS RNG).
pub fn new_token() -> String {
    format!("pdw_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// Checks the operators' problems; `(field, problem)` like other config checks.
pub fn validate(operators: &[OperatorConfig]) -> Result<(), (String, String)> {
    let mut names = std::collections::HashSet::new();
    // Token hash → the operator holding it: a token is one operator's, or
    // the first match would decide who acted (issue 32: bob acted as alice).
    let mut tokens = std::collections::HashMap::new();
    for (i, o) in operators.iter().enumerate() {
        if o.name.trim().is_empty() {
            return Err((format!("operator[{i}].name"), "must not be empty".into()));
        }
        if !names.insert(o.name.as_str()) {
            return Err((
                format!("operator[{i}].name"),
                format!("duplicate operator {:?}", o.name),
            ));
        }
        let h = &o.token_sha256;
        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err((
                format!("operator[{i}].token_sha256"),
                "must be 64 lower-case hex digits (the SHA-256 of the token, never the token itself)".into(),
            ));
        }
        if let Some(first) = tokens.insert(h.as_str(), o.name.as_str()) {
            return Err((
                format!("operator[{i}].token_sha256"),
                format!(
                    "operators {first:?} and {:?} have the same token; each operator needs its own (`pdwarden certs token NAME`)",
                    o.name
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 48, item 3: reading a capture's contents is its own role,
    /// between `read` and `operate`, configured by its name.
    #[test]
    fn forensics_is_a_role_between_read_and_operate() {
        assert!(OperatorRole::Read < OperatorRole::Forensics && OperatorRole::Forensics < OperatorRole::Operate);
        let op: OperatorConfig = serde_json::from_value(serde_json::json!({
            "name": "fiona", "role": "forensics", "token_sha256": hash_token("t"),
        }))
        .unwrap();
        assert_eq!(op.role, OperatorRole::Forensics);
        for r in [OperatorRole::Read, OperatorRole::Forensics, OperatorRole::Operate] {
            assert_eq!(OperatorRole::from_name(r.as_str()), Some(r));
        }
        assert_eq!(OperatorRole::from_name("insecure"), None);
    }

    /// A plaintext token in the config is refused, naming the field.
    #[test]
    fn config_holds_hashes_only() {
        let bad = OperatorConfig {
            name: "a".into(),
            role: OperatorRole::Read,
            token_sha256: new_token(),
        };
        assert_eq!(validate(&[bad]).unwrap_err().0, "operator[0].token_sha256");
        assert_eq!(hash_token("abc").len(), 64);
    }

    /// Issue 32 (secrets): two operators with one token hash were both
    /// accepted and the first match won (bob acted as alice).
    #[test]
    fn a_token_hash_belongs_to_one_operator_only() {
        let op = |name: &str, token: &str| OperatorConfig {
            name: name.into(),
            role: OperatorRole::Read,
            token_sha256: hash_token(token),
        };
        let (field, problem) = validate(&[op("alice", "t1"), op("carol", "t2"), op("bob", "t1")]).unwrap_err();
        assert_eq!(field, "operator[2].token_sha256");
        assert!(
            problem.contains("\"alice\"") && problem.contains("\"bob\""),
            "{problem}"
        );
        assert!(!problem.contains(&hash_token("t1")), "{problem}");
        validate(&[op("alice", "t1"), op("bob", "t2")]).unwrap();
    }
}
