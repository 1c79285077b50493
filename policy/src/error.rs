//! The errors sluice's layers produce, and what each one means.
//!
//! Errors travel between layers as [`BoxError`]. Each concrete type says
//! whose fault it is and whether a retry may help ([`Fault`],
//! [`ErrorInfo`]), so the retry policy, the breaker and the proxy's edge
//! function decide from data, never from string matching. Refusals that
//! sluice makes itself (queue full, circuit open, run stopped) never reach
//! the provider, so they never count against it.

use std::time::Duration;

pub use crate::breaker::CircuitOpen;
pub use crate::bulkhead::BulkheadFull;
use crate::outcome::Outcome;
pub use crate::pacer::RateLimited;
pub use crate::run::RunStopped;

/// The error type between layers (tower's convention).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future every policy layer returns: the layers wait (for a slot, a
/// permit, a probe) inside it, so it is an `async` block, boxed.
pub type BoxFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, BoxError>> + Send + 'static>>;

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// sluice refused to send (protecting the provider or a budget).
    Sluice,
    /// The provider or the network to it failed.
    Upstream,
    /// The client's request could not be sent as it was.
    Client,
}

/// How an upstream attempt failed before a response head arrived. The proxy
/// wraps its client's errors in [`Upstream`] with one of these kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamKind {
    /// The name did not resolve.
    Dns,
    /// The connection was refused.
    ConnectionRefused,
    /// The connection could not be made in time.
    ConnectionTimeout,
    /// The connection closed or reset before a response head.
    ConnectionClosed,
    /// The TLS handshake failed because the certificate was not trusted.
    TlsCertificate,
    /// The TLS handshake failed for another reason.
    TlsProtocol,
    /// The upstream spoke something that is not HTTP.
    Protocol,
    /// The destination is forbidden by sluice's destination policy.
    Prohibited,
    /// The client's request body failed while it was being sent (a
    /// malformed chunk, the client gone): the client's fault, never the
    /// provider's.
    ClientBody,
}

impl UpstreamKind {
    /// Whether a new attempt might succeed. A prohibited destination, an
    /// untrusted certificate or a name that does not exist will not change
    /// by retrying.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            UpstreamKind::ConnectionRefused
                | UpstreamKind::ConnectionTimeout
                | UpstreamKind::ConnectionClosed
        )
    }
}

/// An upstream attempt failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
#[error("upstream {kind:?}: {source}")]
pub struct Upstream {
    /// What went wrong.
    pub kind: UpstreamKind,
    /// The underlying error.
    #[source]
    pub source: BoxError,
}

impl Upstream {
    /// Wraps an error with its kind.
    pub fn new(kind: UpstreamKind, source: impl Into<BoxError>) -> Self {
        Upstream {
            kind,
            source: source.into(),
        }
    }
}

/// What the layers need to know about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorInfo {
    /// Whose fault it is.
    pub fault: Fault,
    /// What the attempt came back with, if it reached the provider.
    pub outcome: Option<Outcome>,
    /// Whether a retry may help.
    pub retryable: bool,
    /// When to come back, if known.
    pub retry_after: Option<Duration>,
}

/// Classifies any error that can come out of a provider's stack.
pub fn info(err: &BoxError) -> ErrorInfo {
    let sluice = |retry_after| ErrorInfo {
        fault: Fault::Sluice,
        outcome: None,
        retryable: false,
        retry_after,
    };
    if let Some(e) = err.downcast_ref::<RateLimited>() {
        return sluice(Some(e.retry_after));
    }
    if let Some(e) = err.downcast_ref::<CircuitOpen>() {
        return sluice(Some(e.retry_after));
    }
    if let Some(e) = err.downcast_ref::<BulkheadFull>() {
        return sluice(Some(e.retry_after));
    }
    if err.downcast_ref::<RunStopped>().is_some() {
        return sluice(None);
    }
    if err
        .downcast_ref::<tower::timeout::error::Elapsed>()
        .is_some()
    {
        return ErrorInfo {
            fault: Fault::Upstream,
            outcome: Some(Outcome::Timeout),
            retryable: true,
            retry_after: None,
        };
    }
    if let Some(e) = err.downcast_ref::<Upstream>() {
        let client = matches!(e.kind, UpstreamKind::Prohibited | UpstreamKind::ClientBody);
        return ErrorInfo {
            fault: if client {
                Fault::Client
            } else {
                Fault::Upstream
            },
            outcome: (!client).then_some(match e.kind {
                UpstreamKind::ConnectionTimeout => Outcome::Timeout,
                _ => Outcome::ConnectError,
            }),
            retryable: e.kind.is_retryable(),
            retry_after: None,
        };
    }
    // Anything else came from below without a kind: count it as the
    // provider's connection failing, but do not retry what we cannot name.
    ErrorInfo {
        fault: Fault::Upstream,
        outcome: Some(Outcome::ConnectError),
        retryable: false,
        retry_after: None,
    }
}

pub(crate) fn attempt_outcome(err: &BoxError) -> Option<Outcome> {
    info(err).outcome
}
