//! Who sent a request: the proxy user its credentials name, if credentials
//! are in use, and which of the collector's runs it is for. Read by
//! forwarding and tunnels; set by the listener's proxy authentication
//! (`serve::auth`).

use crate::runs::records::Mode;

/// Who sent a request: the proxy user, if credentials are in use, and the
/// run mode its credentials name (`NAME+catchup`, `NAME+steady`), if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The proxy user (a collector's name, for a collector).
    pub user: Option<String>,
    /// The mode of the collector's run the request is for: a steady run
    /// and a catch-up run of one collector may be active at once (R-FS1).
    pub mode: Option<Mode>,
}

impl Identity {
    /// Anyone, where no credentials are configured.
    pub fn anonymous() -> Identity {
        Identity::default()
    }

    /// Proxy user `user`, naming no run mode.
    pub fn user(user: impl Into<String>) -> Identity {
        Identity {
            user: Some(user.into()),
            mode: None,
        }
    }
}
