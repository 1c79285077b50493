//! Composes one provider's stack.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use tower::retry::Retry;
use tower::{Service, ServiceExt};

use crate::attempt::CarriesReport;
use crate::breaker::BreakerLayer;
use crate::bulkhead::BulkheadLayer;
use crate::error::{BoxFuture, Cause};
use crate::pacer::PacerLayer;
use crate::park::ParkLayer;
use crate::provider::ProviderPolicy;
use crate::retry::{ReplayBody, RetryPolicy};
use crate::run::RunLayer;
use crate::timeout::{AttemptTimeoutLayer, RequestTimeoutLayer};

/// A provider's whole stack behind one pointer: a clone for each request
/// is a reference count (no box, as `BoxCloneSyncService` made), and the
/// stack's future — the layers' futures nested, none boxed on the fast
/// path — is boxed once.
pub struct ProviderService<B, R>(Arc<dyn Stack<B, R>>);

impl<B, R> Clone for ProviderService<B, R> {
    fn clone(&self) -> Self {
        ProviderService(self.0.clone())
    }
}

impl<B, R> std::fmt::Debug for ProviderService<B, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProviderService")
    }
}

impl<B, R> Service<Request<B>> for ProviderService<B, R> {
    type Response = Response<R>;
    type Error = Cause;
    type Future = BoxFuture<Response<R>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.0.send(req)
    }
}

/// A stack called through a shared reference: each request readies a
/// clone. (Not named `call`: `Service::call` on the clone would then
/// resolve to this one.)
trait Stack<B, R>: Send + Sync {
    fn send(&self, req: Request<B>) -> BoxFuture<Response<R>>;
}

/// What one provider's stack is made of: its policy and the upstream. The
/// stack is composed for each request from them — a request cloned the
/// whole composed stack before (a reference count a layer), composing it
/// costs about as much, and a provider keeps 16 bytes rather than the
/// stack's 144 (R-PF1, issue 38).
struct Parts<S> {
    policy: Arc<ProviderPolicy>,
    upstream: S,
}

impl<S, B, R> Stack<B, R> for Parts<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + Sync + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: ReplayBody + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    fn send(&self, req: Request<B>) -> BoxFuture<Response<R>> {
        send(&self.policy, self.upstream.clone(), req)
    }
}

/// Sends `req` through `policy`'s provider's stack over `upstream`,
/// composed for this request (see [`provider_stack`]'s order): what a
/// [`ProviderService`] does, for a caller that keeps the policy and the
/// upstream already — a table of a hundred thousand providers keeps no
/// stack of each (R-PF1, issue 38: 48 bytes a provider).
pub fn send<S, B, R>(
    policy: &Arc<ProviderPolicy>,
    upstream: S,
    req: Request<B>,
) -> BoxFuture<Response<R>>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + Sync + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: ReplayBody + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    let mut stack = compose(policy, upstream);
    // Every layer is ready at once; one that is not is waited for.
    match stack.poll_ready(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(())) => Box::pin(stack.call(req)),
        Poll::Ready(Err(e)) => Box::pin(std::future::ready(Err(e))),
        Poll::Pending => Box::pin(async move { stack.ready().await?.call(req).await }),
    }
}

/// Builds the stack of `policy`'s provider over `upstream`.
///
/// The order is REQUIREMENTS §2's, numbered from the outermost (0).
/// Every attempt, first, retry or parked re-send, passes the run check,
/// the breaker, the pacer and the bulkhead, because retry and parking are
/// outside them all.
pub fn provider_stack<S, B, R>(policy: &Arc<ProviderPolicy>, upstream: S) -> ProviderService<B, R>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + Sync + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: ReplayBody + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    ProviderService(Arc::new(Parts {
        policy: policy.clone(),
        upstream,
    }))
}

/// The stack of `policy`'s provider over `upstream`, in the order above.
fn compose<S, B, R>(
    policy: &Arc<ProviderPolicy>,
    upstream: S,
) -> impl Service<Request<B>, Response = Response<R>, Error = Cause, Future: Send + 'static>
       + Send
       + 'static
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + Sync + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: ReplayBody + Send + 'static,
    R: CarriesReport + Send + 'static,
{
    // Built from the inside out, each layer's handles moved into its
    // service (a `ServiceBuilder` counts each again and drops its own).
    // 7. Per-attempt timeout: connect + response head.
    let s = AttemptTimeoutLayer::new(policy.clone()).wrap(upstream);
    // 6. Bulkhead: attempts in flight; stamps TTFB and the outcome.
    let s = BulkheadLayer::new(policy.clone()).wrap(s);
    // 5. Pacer: GCRA slot at the AIMD rate, Retry-After hold, FIFO.
    let s = PacerLayer::new(policy.clone()).wrap(s);
    // 4. Circuit breaker: fail fast while open.
    let s = BreakerLayer::new(policy.clone()).wrap(s);
    // 3. Run envelope: request cap and deadline, before each attempt;
    //    a run's request waits out a long hold.
    let s = RunLayer::new(policy.name.clone(), policy.clone()).wrap(s);
    // 2. Parking: while the provider is down, requests wait and only
    //    probes go; failures that prove a request unprocessed wait
    //    too, and resume when it is back (R-RN8, R-RN13).
    let s = ParkLayer::new(policy.name.clone(), policy.clone()).wrap(s);
    // 1. Retry: ratio budget, full jitter, exact Retry-After.
    let s = Retry::new(RetryPolicy::new(policy.clone()), s);
    // 0. Request timeout: the whole request, every attempt and wait,
    //    up to its response head.
    RequestTimeoutLayer::new(policy.clone()).wrap(s)
}
