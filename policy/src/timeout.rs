//! The timeouts: per attempt (R-TO1: connect plus response head) and per
//! request (issue 20: every attempt, pacing wait and retry of one request,
//! up to its response head).
//!
//! tower's `Timeout` fixes its duration when the stack is built; these
//! read the provider's current setting on every call, so a config reload
//! changes them without rebuilding the stack. A request has one timer for
//! both: the attempt under way tells the request's clock its bound, the
//! request's timer wakes the request at the earlier of the two, and the
//! attempt, polled again, finds itself past its bound (a timer costs a
//! lock on the runtime's timer wheel to arm and another to disarm, twice a
//! request before: R-PF1, issue 38). An attempt sent without a request's
//! clock keeps a timer of its own. A timed-out attempt fails
//! with [`Cause::AttemptTimeout`], which the breaker and the retry policy
//! count as a timeout; a request past its bound fails with
//! [`Cause::RequestTimeout`], which the client gets as a `504`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::Request;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use crate::attempt::{Attempt, CarriesAttempt, RequestClock};
use crate::error::{Cause, RequestTimeout};

/// A duration that can be changed while services read it.
#[derive(Debug, Default)]
pub struct SharedDuration(AtomicU64);

impl SharedDuration {
    /// Holds `d` (saturating at u64::MAX nanoseconds).
    pub fn new(d: Duration) -> Self {
        SharedDuration(AtomicU64::new(d.as_nanos().min(u64::MAX as u128) as u64))
    }

    /// The current value.
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// Changes it.
    pub fn set(&self, d: Duration) {
        self.0
            .store(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }
}

/// Where the per-attempt timeout layer reads its bound on each call: a
/// shared duration of its own, or a provider's policy, which keeps it
/// inline (R-PF1, issue 38: no allocation a provider for it).
pub trait AttemptBound: Send + Sync + std::fmt::Debug {
    /// The bound now.
    fn attempt_timeout(&self) -> Duration;
}

/// Where the whole-request timeout layer reads its bound on each call.
pub trait RequestBound: Send + Sync + std::fmt::Debug {
    /// The bound now.
    fn request_timeout(&self) -> Duration;
}

impl AttemptBound for SharedDuration {
    fn attempt_timeout(&self) -> Duration {
        self.get()
    }
}

impl RequestBound for SharedDuration {
    fn request_timeout(&self) -> Duration {
        self.get()
    }
}

/// Applies the per-attempt timeout.
#[derive(Debug, Clone)]
pub struct AttemptTimeoutLayer {
    limit: Arc<dyn AttemptBound>,
}

impl AttemptTimeoutLayer {
    /// A layer reading `limit` on each call.
    pub fn new(limit: Arc<dyn AttemptBound>) -> Self {
        AttemptTimeoutLayer { limit }
    }
}

impl AttemptTimeoutLayer {
    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> AttemptTimeout<S> {
        AttemptTimeout {
            inner,
            limit: self.limit,
        }
    }
}

impl<S> Layer<S> for AttemptTimeoutLayer {
    type Service = AttemptTimeout<S>;

    fn layer(&self, inner: S) -> AttemptTimeout<S> {
        AttemptTimeout {
            inner,
            limit: self.limit.clone(),
        }
    }
}

/// The service of [`AttemptTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct AttemptTimeout<S> {
    inner: S,
    limit: Arc<dyn AttemptBound>,
}

impl<S, B> Service<Request<B>> for AttemptTimeout<S>
where
    S: Service<Request<B>>,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    B: CarriesAttempt,
{
    type Response = S::Response;
    type Error = Cause;
    type Future = AttemptTimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let limit = self.limit.attempt_timeout();
        let kind = match Attempt::of(&req).and_then(|a| a.clock.clone()) {
            Some(clock) => Kind::Clocked {
                bound: crate::clock::now() + limit,
                clock,
                told: false,
                call: self.inner.call(req),
            },
            None => Kind::Timed {
                call: tokio::time::timeout(limit, self.inner.call(req)),
            },
        };
        AttemptTimeoutFuture { kind }
    }
}

pin_project! {
    /// An attempt within its timeout.
    #[derive(Debug)]
    pub struct AttemptTimeoutFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[derive(Debug)]
    #[project = KindProj]
    enum Kind<F> {
        // A request's attempt: its bound kept by the request's timer (told
        // to the request's clock when it first waits), checked each time it
        // is polled again — one timer a request, not two.
        Clocked {
            #[pin]
            call: F,
            bound: Instant,
            clock: RequestClock,
            told: bool,
        },
        // An attempt without a request's clock: a timer of its own.
        Timed {
            #[pin]
            call: tokio::time::Timeout<F>,
        },
    }
}

impl<F, T, E> Future for AttemptTimeoutFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<Cause>,
{
    type Output = Result<T, Cause>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Clocked {
                call,
                bound,
                clock,
                told,
            } => {
                if let Poll::Ready(r) = call.poll(cx) {
                    if *told {
                        clock.attempt_over(*bound);
                    }
                    return Poll::Ready(r.map_err(Into::into));
                }
                if !*told {
                    // Its first wait: the bound lies ahead (the timeout is
                    // never zero), and the request's timer wakes it then.
                    *told = true;
                    clock.attempt_until(*bound);
                } else if crate::clock::now() >= *bound {
                    clock.attempt_over(*bound);
                    return Poll::Ready(Err(Cause::AttemptTimeout));
                }
                Poll::Pending
            }
            KindProj::Timed { call } => Poll::Ready(match ready!(call.poll(cx)) {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(Cause::AttemptTimeout),
            }),
        }
    }
}

/// Bounds a request's whole way through the provider's stack — pacing
/// waits, attempts, retries and their back-off — up to its response head
/// (the body streams unbounded, as a long export must).
#[derive(Debug, Clone)]
pub struct RequestTimeoutLayer {
    limit: Arc<dyn RequestBound>,
}

impl RequestTimeoutLayer {
    /// A layer reading `limit` on each call.
    pub fn new(limit: Arc<dyn RequestBound>) -> Self {
        RequestTimeoutLayer { limit }
    }
}

impl RequestTimeoutLayer {
    /// [`Layer::layer`] taking the layer: its handles move into the
    /// service rather than being counted again (a provider's stack is
    /// composed for each request, R-PF1).
    pub fn wrap<S>(self, inner: S) -> RequestTimeoutService<S> {
        RequestTimeoutService {
            inner,
            limit: self.limit,
        }
    }
}

impl<S> Layer<S> for RequestTimeoutLayer {
    type Service = RequestTimeoutService<S>;

    fn layer(&self, inner: S) -> RequestTimeoutService<S> {
        RequestTimeoutService {
            inner,
            limit: self.limit.clone(),
        }
    }
}

/// The service of [`RequestTimeoutLayer`].
#[derive(Debug, Clone)]
pub struct RequestTimeoutService<S> {
    inner: S,
    limit: Arc<dyn RequestBound>,
}

impl<S, B> Service<Request<B>> for RequestTimeoutService<S>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    B: CarriesAttempt + Send + 'static,
{
    type Response = S::Response;
    type Error = Cause;
    type Future = RequestTimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let started = crate::clock::now();
        let deadline = started + self.limit.request_timeout();
        let clock = RequestClock::new(deadline);
        Attempt::of_mut(&mut req).clock = Some(clock.clone());
        RequestTimeoutFuture {
            sleep: None,
            call: self.inner.call(req),
            clock,
            started,
        }
    }
}

pin_project! {
    /// A request within its bound, which a run's wait may move on.
    #[derive(Debug)]
    pub struct RequestTimeoutFuture<F> {
        #[pin]
        call: F,
        // The request's one timer: made when the request first waits (an
        // answer at once needs none), set to the earlier of its bound and
        // its attempt's.
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        clock: RequestClock,
        started: Instant,
    }
}

impl<F, T, E> Future for RequestTimeoutFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<Cause>,
{
    type Output = Result<T, Cause>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let Poll::Ready(result) = this.call.as_mut().poll(cx) {
                return Poll::Ready(result.map_err(Into::into));
            }
            // A run's wait may have moved the bound on meanwhile, and an
            // attempt may have begun or ended.
            let (wake, deadline) = this.clock.wake_at();
            match this.sleep.as_mut().as_pin_mut() {
                Some(sleep) if sleep.deadline() == wake => {}
                Some(sleep) => sleep.reset(wake),
                None => this.sleep.set(Some(tokio::time::sleep_until(wake))),
            }
            if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
                ready!(sleep.poll(cx));
            }
            let now = crate::clock::now();
            if deadline <= now {
                return Poll::Ready(Err(Cause::RequestTimeout(RequestTimeout {
                    after: now.saturating_duration_since(*this.started),
                    attempts: this.clock.attempts(),
                })));
            }
            // An attempt's bound passed: polled again, it fails as timed
            // out (and a retry may begin another, with a bound of its own).
            // One that is not polled again no longer sets the timer.
            this.clock.attempt_over(now);
        }
    }
}
