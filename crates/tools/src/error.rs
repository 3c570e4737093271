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

/// The one conversion of a runtime that could not start into a role's error: a CPU that
/// cannot be pinned is the command line's to fix, a worker thread that died is a runtime
/// failure, and a worker that could not open its sockets or rings is judged by the role
/// (`open`, given that error and the whole message), which knows what it needed.
pub fn start_error<E: std::fmt::Display>(
    e: flowlane_runtime::StartError<E>,
    open: impl FnOnce(&E, String) -> ToolError,
) -> ToolError {
    use flowlane_runtime::StartError;
    let message = e.to_string();
    match &e {
        StartError::Pin { .. } => ToolError::usage(message),
        StartError::Open(o) => open(o, message),
        StartError::Thread(_) => ToolError::runtime(message),
    }
}

/// A socket group that could not bind (serve, http serve): a busy port or an address that is
/// not here is the command line's to fix, a low port without the privilege the user's.
pub fn group_open(g: &flowlane_io::udp::GroupError, message: String) -> ToolError {
    use flowlane_io::udp::GroupError;
    match g {
        GroupError::AddrInUse(a) => ToolError::usage(message).because(Cause::AddrInUse(*a)),
        GroupError::PermissionDenied(_) => ToolError::privilege(message),
        GroupError::AddrNotAvailable(_) => ToolError::usage(message),
        GroupError::Sys(_) => ToolError::runtime(message),
    }
}

/// A socket or ring refused to this process (EPERM, EACCES) is a missing privilege, said with
/// what the role needs (`needs`); any other failure is a runtime one.
pub fn denied_open(err: &flowlane_io::SysError, message: String, needs: &str) -> ToolError {
    if err.source.kind() == std::io::ErrorKind::PermissionDenied {
        ToolError::privilege(format!("{message}: {needs}"))
    } else {
        ToolError::runtime(message)
    }
}
