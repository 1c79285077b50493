use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

use super::{RunHandle, RunStopped};
use crate::error::{BoxFuture, Cause};

/// Checks the run envelope of each attempt (first or retry) before it
/// starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunLayer;

impl<S> Layer<S> for RunLayer {
    type Service = RunGate<S>;

    fn layer(&self, inner: S) -> RunGate<S> {
        RunGate { inner }
    }
}

/// The service of [`RunLayer`].
#[derive(Debug, Clone)]
pub struct RunGate<S> {
    inner: S,
}

impl<S, B, R> Service<Request<B>> for RunGate<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Error: Into<Cause>,
    S::Future: Send + 'static,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = Cause;
    type Future = BoxFuture<Response<R>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Cause>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let checked = match req.extensions().get::<RunHandle>() {
            Some(run) => run.check_attempt(Instant::now()),
            None => Ok(()),
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            checked.map_err(|reason| RunStopped { reason })?;
            inner.oneshot(req).await.map_err(Into::into)
        })
    }
}
