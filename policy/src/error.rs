//! The failures sluice's layers produce, and what each one means.
//!
//! Failures travel between the layers of a provider's stack as one enum,
//! [`Cause`], never as a boxed error that would have to be downcast: every
//! question asked of a failure — whose fault it is and whether a retry may
//! help ([`Fault`], [`ErrorInfo`]), the outcome label, and at the proxy's
//! edge the status, `Proxy-Status` and `Retry-After` — is an exhaustive
//! `match`, so the retry policy, the breaker and the edge decide from data,
//! never from string matching, and a new failure does not compile until
//! each of them answers it. Refusals that sluice makes itself (queue full,
//! circuit open, run stopped) never reach the provider, so they never count
//! against it.

use std::time::Duration;

pub use crate::breaker::CircuitOpen;
pub use crate::bulkhead::BulkheadFull;
use crate::classify::Outcome;
pub use crate::pacer::RateLimited;
pub use crate::park::ProviderDown;
pub use crate::run::RunStopped;

/// A boxed error, for what is not a provider's stack (bodies, I/O).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future every policy layer returns: the layers wait (for a slot, a
/// permit, a probe) inside it, so it is an `async` block, boxed.
pub type BoxFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Cause>> + Send + 'static>>;

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

/// An upstream attempt failed before a response head arrived. It reaches
/// the layers as [`Cause::Upstream`].
#[derive(Debug)]
pub struct Upstream {
    /// What went wrong.
    pub kind: UpstreamKind,
    /// The underlying error.
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

/// A request ran past its `request_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTimeout {
    /// How long it had been going.
    pub after: Duration,
    /// Attempts that left for the provider.
    pub attempts: u32,
}

/// Every failure a provider's stack can produce, in one enum.
///
/// The layers' own refusals ([`RateLimited`], [`CircuitOpen`],
/// [`BulkheadFull`], [`RunStopped`]) and [`Upstream`] do not implement
/// `std::error::Error`: the only way into a [`BoxError`] is through a
/// variant here, so a new failure is a new variant, and every question
/// asked of a failure — [`Cause::info`] here; the status, `Proxy-Status`
/// token and `Retry-After` at the proxy's edge; the outcome label of
/// `sluice_requests_total` — is an exhaustive `match` that does not
/// compile until the new variant is answered.
#[derive(Debug)]
pub enum Cause {
    /// The pacer: no pacing slot within the queue wait, or the queue full.
    RateLimited(RateLimited),
    /// The breaker is open.
    CircuitOpen(CircuitOpen),
    /// The bulkhead is full.
    BulkheadFull(BulkheadFull),
    /// A run's envelope stopped the attempt.
    RunStopped(RunStopped),
    /// No response head within the attempt timeout.
    AttemptTimeout,
    /// No response head within the request timeout, every attempt and wait
    /// included.
    RequestTimeout(RequestTimeout),
    /// The attempt failed before a response head.
    Upstream(Upstream),
    /// The provider is down and the request waited parked as long as it
    /// may (`max_outage_wait`).
    ProviderDown(ProviderDown),
}

impl Cause {
    /// What the layers need to know about it.
    pub fn info(&self) -> ErrorInfo {
        let sluice = |retry_after| ErrorInfo {
            fault: Fault::Sluice,
            outcome: None,
            retry_after,
        };
        match self {
            Cause::RateLimited(e) => sluice(Some(e.retry_after)),
            Cause::CircuitOpen(e) => sluice(Some(e.retry_after)),
            Cause::BulkheadFull(e) => sluice(Some(e.retry_after)),
            Cause::RunStopped(_) => sluice(None),
            Cause::ProviderDown(e) => sluice(Some(e.retry_after)),
            Cause::AttemptTimeout | Cause::RequestTimeout(_) => ErrorInfo {
                fault: Fault::Upstream,
                outcome: Some(Outcome::Timeout),
                retry_after: None,
            },
            Cause::Upstream(e) => {
                let client = match e.kind {
                    UpstreamKind::Prohibited | UpstreamKind::ClientBody => true,
                    UpstreamKind::Dns
                    | UpstreamKind::ConnectionRefused
                    | UpstreamKind::ConnectionTimeout
                    | UpstreamKind::ConnectionClosed
                    | UpstreamKind::TlsCertificate
                    | UpstreamKind::TlsProtocol
                    | UpstreamKind::Protocol => false,
                };
                ErrorInfo {
                    fault: if client {
                        Fault::Client
                    } else {
                        Fault::Upstream
                    },
                    outcome: (!client).then_some(match e.kind {
                        UpstreamKind::ConnectionTimeout => Outcome::Timeout,
                        // A new attempt might get through a refused or
                        // reset connection; a name that does not resolve,
                        // an untrusted certificate or a peer that does not
                        // speak HTTP will not change by retrying.
                        kind => Outcome::ConnectError {
                            retryable: matches!(
                                kind,
                                UpstreamKind::ConnectionRefused | UpstreamKind::ConnectionClosed
                            ),
                        },
                    }),
                    retry_after: None,
                }
            }
        }
    }

    /// The pacer refused the request because its slot would come at or
    /// after the instant it may not wait past (its run's deadline): the
    /// run gate turns this into the run's planned stop (R-RN2).
    pub fn is_past_deadline(&self) -> bool {
        matches!(self, Cause::RateLimited(r) if r.refusal == crate::pacer::Refusal::PastDeadline)
    }

    /// The `sluice_requests_total{outcome}` label of a request that ended
    /// in this failure (R-OP1).
    pub fn outcome_label(&self) -> &'static str {
        match self {
            Cause::RateLimited(_) | Cause::BulkheadFull(_) => "shed",
            Cause::CircuitOpen(_) => "circuit_open",
            Cause::ProviderDown(_) => "provider_down",
            Cause::RunStopped(_) => "run_stopped",
            Cause::AttemptTimeout | Cause::RequestTimeout(_) | Cause::Upstream(_) => {
                self.info().outcome.map_or("denied", |o| o.label())
            }
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::RateLimited(e) => write!(
                f,
                "provider rate limit: no slot within the queue wait ({:?}), retry after {:?}",
                e.refusal, e.retry_after
            ),
            Cause::CircuitOpen(e) => write!(
                f,
                "circuit open for this provider, retry after {:?}",
                e.retry_after
            ),
            Cause::BulkheadFull(_) => write!(f, "too many requests in flight to this provider"),
            Cause::RunStopped(e) => write!(f, "run stopped: {}", e.reason.label()),
            Cause::AttemptTimeout => write!(f, "no response head within the attempt timeout"),
            Cause::RequestTimeout(e) => write!(
                f,
                "no response head within the request timeout ({:?}, {} attempts)",
                e.after, e.attempts
            ),
            Cause::Upstream(e) => write!(f, "upstream {:?}: {}", e.kind, e.source),
            Cause::ProviderDown(e) => write!(
                f,
                "provider down ({}), parked {:?}",
                e.reason.label(),
                e.waited
            ),
        }
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Cause::Upstream(e) => Some(&*e.source),
            _ => None,
        }
    }
}

macro_rules! into_cause {
    ($($t:ident),*) => {$(
        impl From<$t> for Cause {
            fn from(e: $t) -> Cause {
                Cause::$t(e)
            }
        }
    )*};
}

into_cause!(
    RateLimited,
    CircuitOpen,
    BulkheadFull,
    RunStopped,
    Upstream,
    ProviderDown
);

/// What the layers need to know about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorInfo {
    /// Whose fault it is.
    pub fault: Fault,
    /// What the attempt came back with, if it reached the provider; whether
    /// a retry may help is its [`Outcome::is_retryable`].
    pub outcome: Option<Outcome>,
    /// When to come back, if known.
    pub retry_after: Option<Duration>,
}
