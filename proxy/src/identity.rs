//! Who sent a request: the proxy user its credentials name, if credentials
//! are in use. Read by forwarding and tunnels; set by the listener's proxy
//! authentication (`serve::auth`).

/// Who sent a request: the proxy user, if credentials are in use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity(pub Option<String>);
