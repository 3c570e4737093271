//! The error every role returns: what went wrong, in words, and which kind of wrong it is.

use serde::{Deserialize, Serialize};

/// Who can fix a failure. The CLI maps it to the exit code (usage and privilege: 2, the
/// command line can fix it; runtime: 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorKind {
    /// A value the user gave cannot work (a CPU that is not usable, a busy port, an address
    /// that is not on this host).
    Usage,
    /// The job needs a capability this process lacks (root, CAP_NET_ADMIN, CAP_BPF).
    Privilege,
    /// The job could not be done as asked.
    Runtime,
}

/// A role's failure: its kind and a message that says what and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// Who can fix it.
    pub kind: ErrorKind,
    /// What happened, in words.
    pub message: String,
    /// A cause a caller may act on (e.g. choose another port), where there is one.
    pub cause: Option<Cause>,
}

/// Causes a caller can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// Another socket holds this address and port.
    AddrInUse(std::net::SocketAddr),
}

impl ToolError {
    /// A usage error.
    pub fn usage(message: impl Into<String>) -> ToolError {
        ToolError {
            kind: ErrorKind::Usage,
            message: message.into(),
            cause: None,
        }
    }

    /// A missing privilege.
    pub fn privilege(message: impl Into<String>) -> ToolError {
        ToolError {
            kind: ErrorKind::Privilege,
            message: message.into(),
            cause: None,
        }
    }

    /// A runtime failure.
    pub fn runtime(message: impl Into<String>) -> ToolError {
        ToolError {
            kind: ErrorKind::Runtime,
            message: message.into(),
            cause: None,
        }
    }

    /// The same error with a cause a caller may act on.
    pub fn because(mut self, cause: Cause) -> ToolError {
        self.cause = Some(cause);
        self
    }
}

/// A configuration's seconds as a duration: positive and at most 100 years, else a usage error
/// naming `what` (one check for every role).
pub(crate) fn seconds(what: &str, v: f64) -> Result<std::time::Duration, ToolError> {
    match std::time::Duration::try_from_secs_f64(v) {
        Ok(d) if v > 0.0 && d <= std::time::Duration::from_secs(100 * 365 * 86_400) => Ok(d),
        _ => Err(ToolError::usage(format!(
            "the {what} must be a positive number of seconds (at most 100 years), not {v:?}"
        ))),
    }
}
