//! Composes one provider's stack.

use http::{Request, Response};
use tower::retry::RetryLayer;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder};

use crate::breaker::BreakerLayer;
use crate::bulkhead::BulkheadLayer;
use crate::error::Cause;
use crate::pacer::PacerLayer;
use crate::park::ParkLayer;
use crate::provider::ProviderPolicy;
use crate::retry::{ReplayBody, RetryPolicy};
use crate::run::RunLayer;
use crate::timeout::{AttemptTimeoutLayer, RequestTimeoutLayer};

/// A provider's whole stack, boxed at the provider boundary.
pub type ProviderService<B, R> = BoxCloneSyncService<Request<B>, Response<R>, Cause>;

/// Builds the stack of `policy`'s provider over `upstream`.
///
/// The order is REQUIREMENTS §2's; the first `.layer()` is the outermost.
/// Every attempt, first, retry or parked re-send, passes the run check,
/// the breaker, the pacer and the bulkhead, because retry and parking are
/// outside them all.
pub fn provider_stack<S, B, R>(policy: &ProviderPolicy, upstream: S) -> ProviderService<B, R>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + Sync + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: ReplayBody + Send + 'static,
    R: Send + 'static,
{
    let stack = ServiceBuilder::new()
        // 0. Request timeout: the whole request, every attempt and wait,
        //    up to its response head.
        .layer(RequestTimeoutLayer::new(policy.request_timeout.clone()))
        // 1. Retry: ratio budget, full jitter, exact Retry-After.
        .layer(RetryLayer::new(RetryPolicy::new(policy.retry.clone())))
        // 2. Parking: while the provider is down, requests wait and only
        //    probes go; failures that prove a request unprocessed wait
        //    too, and resume when it is back (R-RN8, R-RN13).
        .layer(ParkLayer::new(policy.name(), policy.park.clone()))
        // 3. Run envelope: request cap and deadline, before each attempt;
        //    a run's request waits out a long hold.
        .layer(RunLayer::new(
            policy.name(),
            policy.pressure(),
            policy.pricing(),
        ))
        // 4. Circuit breaker: fail fast while open.
        .layer(BreakerLayer::new(policy.breaker.clone()))
        // 5. Pacer: GCRA slot at the AIMD rate, Retry-After hold, FIFO.
        .layer(PacerLayer::new(policy.pacer.clone()))
        // 6. Bulkhead: attempts in flight; stamps TTFB and the outcome.
        .layer(BulkheadLayer::new(policy.bulkhead.clone()))
        // 7. Per-attempt timeout: connect + response head.
        .layer(AttemptTimeoutLayer::new(policy.attempt_timeout.clone()))
        .service(upstream);
    BoxCloneSyncService::new(stack)
}
