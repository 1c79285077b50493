//! Bodies: the request body sent upstream (streamed, or kept whole when a
//! retry may need it) and the idle timeout on response bodies.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use sluice_policy::attempt::{Attempt, CarriesAttempt, CarriesReport, Report};
use sluice_policy::bulkhead::Permit;
use sluice_policy::retry::ReplayBody;
use sluice_policy::BoxError;
use tokio::time::Sleep;

use crate::upstream::pool::Checkin;

/// The body type every response sluice sends has.
pub type ResBody = BoxBody<Bytes, BoxError>;

/// A small body of sluice's own.
pub fn full(text: impl Into<Bytes>) -> ResBody {
    Full::new(text.into()).map_err(|e| match e {}).boxed()
}

/// The client's request body failed while sluice streamed it upstream (a
/// malformed chunk, a client that went away): marked so that the failure
/// is classified as the client's, never the provider's (R-SF3).
#[derive(Debug, thiserror::Error)]
#[error("client request body: {0}")]
pub struct ClientBodyError(#[source] pub hyper::Error);

/// A request body on its way upstream (R-PX1): streamed as it comes, or —
/// only when a retry may need it and it fits the replay limit — kept whole
/// so that it can be sent again. It carries the request's [`Attempt`] for
/// the provider's stack (no extension map to allocate and to copy for each
/// retry's copy).
#[derive(Debug)]
pub struct ProxyBody {
    content: Content,
    attempt: Attempt,
}

#[derive(Debug)]
enum Content {
    /// No body.
    Empty,
    /// A body kept whole; replayable.
    Whole(Option<Bytes>),
    /// A body streamed from the client; sent once.
    Stream(Incoming),
}

impl ProxyBody {
    /// No body.
    pub fn empty() -> Self {
        ProxyBody::of(Content::Empty)
    }

    /// A body kept whole; replayable.
    pub fn whole(bytes: Bytes) -> Self {
        ProxyBody::of(Content::Whole(Some(bytes)))
    }

    /// A body streamed from the client; sent once.
    pub fn stream(body: Incoming) -> Self {
        ProxyBody::of(Content::Stream(body))
    }

    fn of(content: Content) -> Self {
        ProxyBody {
            content,
            attempt: Attempt::default(),
        }
    }
}

impl CarriesAttempt for ProxyBody {
    fn attempt(req: &Request<Self>) -> Option<&Attempt> {
        Some(&req.body().attempt)
    }

    fn attempt_mut(req: &mut Request<Self>) -> &mut Attempt {
        &mut req.body_mut().attempt
    }
}

impl ReplayBody for ProxyBody {
    fn try_clone(&self) -> Option<Self> {
        let content = match &self.content {
            Content::Empty => Content::Empty,
            Content::Whole(b) => Content::Whole(b.clone()),
            Content::Stream(_) => return None,
        };
        Some(ProxyBody {
            content,
            attempt: self.attempt.clone(),
        })
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().content {
            Content::Empty => Poll::Ready(None),
            Content::Whole(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Content::Stream(s) => Pin::new(s)
                .poll_frame(cx)
                .map_err(|e| ClientBodyError(e).into()),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.content {
            Content::Empty => true,
            Content::Whole(b) => b.is_none(),
            Content::Stream(s) => s.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.content {
            Content::Empty => SizeHint::with_exact(0),
            Content::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Content::Stream(s) => s.size_hint(),
        }
    }
}

/// A response body that stopped sending for longer than this was cut.
#[derive(Debug, thiserror::Error)]
#[error("response body idle for {0:?}")]
pub struct BodyIdle(pub Duration);

/// Cuts a body that sends nothing for `idle` (R-TO1's idle-body timeout),
/// so a provider that stalls mid-body cannot hold a client forever.
#[derive(Debug)]
pub struct IdleTimeout<B> {
    inner: B,
    idle: Duration,
    /// Set at the first wait.
    sleep: Option<Pin<Box<Sleep>>>,
    /// A frame came since the timer was last set.
    progressed: bool,
}

impl<B> IdleTimeout<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, idle: Duration) -> Self {
        IdleTimeout {
            inner,
            idle,
            sleep: None,
            progressed: false,
        }
    }
}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.progressed = true;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                // The idle clock starts when sluice finds itself waiting,
                // and again after each frame; a body that is all there
                // when its head is (most answers) never sets a timer.
                let deadline = || tokio::time::Instant::now() + this.idle;
                let sleep = match &mut this.sleep {
                    Some(sleep) => {
                        if std::mem::take(&mut this.progressed) {
                            sleep.as_mut().reset(deadline());
                        }
                        sleep
                    }
                    None => {
                        this.progressed = false;
                        this.sleep
                            .insert(Box::pin(tokio::time::sleep_until(deadline())))
                    }
                };
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyIdle(this.idle).into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body from upstream: streamed as it comes, or — for an answer
/// whose dialect reads its body ([`Dialect::reads_body`]) — its first bytes
/// read ahead (at most [`ERROR_BODY_MAX`]) and sent first, then the rest
/// as it comes (R-PD3).
///
/// [`Dialect::reads_body`]: sluice_policy::classify::Dialect::reads_body
/// [`ERROR_BODY_MAX`]: sluice_policy::classify::dialect::ERROR_BODY_MAX
#[derive(Debug)]
pub struct UpstreamBody {
    /// What was read ahead and is still to send, for a body its dialect
    /// read the start of: boxed, as most bodies are streamed as they come
    /// and every layer moves the answer (R-PF1, issue 38).
    ahead: Option<Box<Ahead>>,
    /// The rest; `None` once it ended while reading ahead.
    rest: Option<Incoming>,
    /// Whether it failed (read ahead or streamed): its connection is not
    /// reused.
    failed: bool,
    /// Whether it was read to its end.
    ended: bool,
    /// Its HTTP/1.1 connection, given back to the pool when this body is
    /// dropped having ended cleanly (R-PF1).
    checkin: Option<Checkin<ProxyBody>>,
    /// What its attempt learned, for the provider's stack.
    report: Option<Report>,
    /// Its attempt's bulkhead permit: the attempt is in flight until this
    /// body is done (R-BH1).
    _in_flight: Option<Permit>,
}

impl CarriesReport for UpstreamBody {
    fn report(resp: &Response<Self>) -> Option<&Report> {
        resp.body().report.as_ref()
    }

    fn report_mut(resp: &mut Response<Self>) -> Option<&mut Report> {
        resp.body_mut().report.as_mut()
    }

    fn set_report(resp: &mut Response<Self>, report: Report) {
        resp.body_mut().report = Some(report);
    }

    fn hold(resp: &mut Response<Self>, permit: Permit) {
        resp.body_mut()._in_flight = Some(permit);
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        let Some(checkin) = self.checkin.take() else {
            return;
        };
        let clean =
            !self.failed && (self.ended || self.rest.as_ref().is_none_or(|r| r.is_end_stream()));
        if clean {
            checkin.done();
        }
    }
}

/// What a body read ahead has still to send, in order.
#[derive(Debug, Default)]
struct Ahead {
    /// What was read ahead, not yet sent on.
    head: Option<Bytes>,
    /// A trailers frame met while reading ahead, sent after the head.
    trailers: Option<http::HeaderMap>,
    /// A failure met while reading ahead, reported after the head, where
    /// it came.
    error: Option<hyper::Error>,
}

impl UpstreamBody {
    /// A body streamed as it comes.
    pub fn stream(body: Incoming) -> Self {
        UpstreamBody {
            ahead: None,
            rest: Some(body),
            failed: false,
            ended: false,
            checkin: None,
            report: None,
            _in_flight: None,
        }
    }

    /// This body, giving its connection back to the pool when it has
    /// ended.
    pub fn returning(mut self, checkin: Option<Checkin<ProxyBody>>) -> Self {
        self.checkin = checkin;
        self
    }

    /// Reads up to `max` bytes of `body` ahead: the bytes read, and the
    /// body that still sends them all. A body that fails while read ahead
    /// fails where it would have.
    pub async fn read_ahead(mut body: Incoming, max: usize) -> (Bytes, Self) {
        let mut head = bytes::BytesMut::new();
        let (mut trailers, mut error) = (None, None);
        let mut rest = Some(());
        while head.len() < max {
            match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => head.extend_from_slice(&data),
                    Err(frame) => {
                        trailers = frame.into_trailers().ok();
                        rest = None;
                        break;
                    }
                },
                // Reported where it came: after what was read.
                Some(Err(e)) => {
                    error = Some(e);
                    rest = None;
                    break;
                }
                None => {
                    rest = None;
                    break;
                }
            }
        }
        let head = head.freeze();
        let read = head.clone();
        (
            read,
            UpstreamBody {
                failed: error.is_some(),
                ended: rest.is_none(),
                ahead: Some(Box::new(Ahead {
                    head: (!head.is_empty()).then_some(head),
                    trailers,
                    error,
                })),
                rest: rest.map(|()| body),
                checkin: None,
                report: None,
                _in_flight: None,
            },
        )
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(ahead) = this.ahead.as_deref_mut() {
            if let Some(head) = ahead.head.take() {
                return Poll::Ready(Some(Ok(Frame::data(head))));
            }
            if let Some(trailers) = ahead.trailers.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            if let Some(e) = ahead.error.take() {
                return Poll::Ready(Some(Err(e)));
            }
            this.ahead = None;
        }
        let Some(rest) = &mut this.rest else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(rest).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.ended = true,
            Poll::Ready(Some(Err(_))) => this.failed = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ahead
            .as_deref()
            .is_none_or(|a| a.head.is_none() && a.trailers.is_none() && a.error.is_none())
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let head = self
            .ahead
            .as_deref()
            .and_then(|a| a.head.as_ref())
            .map_or(0, |h| h.len() as u64);
        let rest = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), |r| r.size_hint());
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + head);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + head);
        }
        hint
    }
}

/// Reads a request body whole, if it is no larger than `limit`.
pub async fn collect_limited(body: Incoming, limit: usize) -> Result<Bytes, BoxError> {
    let limited = http_body_util::Limited::new(body, limit);
    Ok(limited.collect().await?.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kept_bodies_replay() {
        assert!(ProxyBody::empty().try_clone().is_some());
        let mut whole = ProxyBody::whole(Bytes::from_static(b"abc"));
        whole.attempt.units = Some(3);
        match whole.try_clone() {
            // The copy carries the request's attempt with its bytes.
            Some(ProxyBody {
                content: Content::Whole(Some(b)),
                attempt,
            }) => {
                assert_eq!(&b[..], b"abc");
                assert_eq!(attempt.units, Some(3));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(whole.size_hint().exact(), Some(3));
    }
}
