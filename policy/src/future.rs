//! A layer's response future, without a box on its fast path (issue 38).
//!
//! Each layer used to return its work as an `async` block, boxed: eight
//! allocations a request before the upstream was even called. Most
//! requests wait for nothing — the circuit is closed, a slot and a permit
//! are free — so a layer now decides in `call`, calls its inner service
//! there, and keeps what it does with the answer as a value
//! ([`OnAnswer`]): [`LayerFuture::sent`] is the inner future and that
//! value, nothing allocated. Only a request that must wait first (for a
//! slot, a permit, a probe, a run's reservation) is an `async` block,
//! boxed: [`LayerFuture::waits`].

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::error::{BoxFuture, Cause};

/// What a layer does with its inner service's answer, once it comes.
pub trait OnAnswer<R> {
    /// The answer as the layer passes it on.
    fn on_answer(self, result: Result<Response<R>, Cause>) -> Result<Response<R>, Cause>;
}

/// Passes the answer on untouched.
#[derive(Debug)]
pub struct PassOn;

impl<R> OnAnswer<R> for PassOn {
    fn on_answer(self, result: Result<Response<R>, Cause>) -> Result<Response<R>, Cause> {
        result
    }
}

pin_project! {
    /// A layer's response future: sent at once, waiting first, or refused.
    pub struct LayerFuture<F, A, R> {
        #[pin]
        step: Step<F, A, R>,
    }
}

pin_project! {
    #[project = StepProj]
    enum Step<F, A, R> {
        // Sent at once: the inner call, then what the layer does with its
        // answer (taken when it comes).
        Sent { #[pin] call: F, then: Option<A> },
        // Waits first: the layer's whole work for the request, boxed.
        Waits { wait: BoxFuture<Response<R>> },
        // Refused before sending (taken when polled).
        Refused { refusal: Option<Cause> },
    }
}

impl<F, A, R> LayerFuture<F, A, R> {
    /// The inner call, then `then` with its answer.
    pub fn sent(call: F, then: A) -> Self {
        LayerFuture {
            step: Step::Sent {
                call,
                then: Some(then),
            },
        }
    }

    /// A request that waits first.
    pub fn waits(wait: impl Future<Output = Result<Response<R>, Cause>> + Send + 'static) -> Self {
        LayerFuture {
            step: Step::Waits {
                wait: Box::pin(wait),
            },
        }
    }

    /// A request refused before sending.
    pub fn refused(refusal: impl Into<Cause>) -> Self {
        LayerFuture {
            step: Step::Refused {
                refusal: Some(refusal.into()),
            },
        }
    }
}

impl<F, E, A, R> Future for LayerFuture<F, A, R>
where
    F: Future<Output = Result<Response<R>, E>>,
    E: Into<Cause>,
    A: OnAnswer<R>,
{
    type Output = Result<Response<R>, Cause>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().step.project() {
            StepProj::Sent { call, then } => {
                let result = ready!(call.poll(cx)).map_err(Into::into);
                let then = then
                    .take()
                    .expect("a layer future polled after it completed");
                Poll::Ready(then.on_answer(result))
            }
            StepProj::Waits { wait } => wait.as_mut().poll(cx),
            StepProj::Refused { refusal } => Poll::Ready(Err(refusal
                .take()
                .expect("a layer future polled after it completed"))),
        }
    }
}

impl<F, A, R> std::fmt::Debug for LayerFuture<F, A, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.step {
            Step::Sent { .. } => "LayerFuture::Sent",
            Step::Waits { .. } => "LayerFuture::Waits",
            Step::Refused { .. } => "LayerFuture::Refused",
        })
    }
}

/// The inner service readied by `poll_ready`, for a request that waits
/// first, leaving a clone in its place (tower's idiom: the readied one is
/// the one called).
pub fn take_readied<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}
