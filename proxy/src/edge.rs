//! The one place where a failure becomes an HTTP answer (R-PX4).
//!
//! Every error sluice produces itself — a refusal to protect a provider, a
//! failed connection, a bad request — goes back with the status a client
//! can act on, an RFC 9209 `Proxy-Status` naming the cause, and a
//! `Retry-After` where the wait is known. Details never carry a URL, a
//! path, a header value or a body (R-SF4).

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};
use sluice_policy::error::{
    BulkheadFull, CircuitOpen, RateLimited, RunStopped, Upstream, UpstreamKind,
};
use sluice_policy::retry_after::format_delta;
use sluice_policy::BoxError;

use crate::body::{full, BodyIdle, ResBody};

/// The `Proxy-Status` header name (RFC 9209).
pub const PROXY_STATUS: &str = "proxy-status";

/// An answer sluice makes itself.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The status.
    pub status: StatusCode,
    /// The RFC 9209 error type.
    pub error: &'static str,
    /// A short, fixed description (never request data).
    pub details: String,
    /// When to come back, if known.
    pub retry_after: Option<Duration>,
}

impl Refusal {
    /// A refusal without a wait.
    pub fn new(status: StatusCode, error: &'static str, details: impl Into<String>) -> Self {
        Refusal {
            status,
            error,
            details: details.into(),
            retry_after: None,
        }
    }

    /// The HTTP answer.
    pub fn into_response(self) -> Response<ResBody> {
        let body = format!("sluice: {} ({})\n", self.details, self.error);
        let mut resp = Response::new(full(body));
        *resp.status_mut() = self.status;
        let details = self.details.replace(['"', '\\'], "'");
        let status = format!("sluice; error={}; details=\"{details}\"", self.error);
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&status) {
            h.insert(PROXY_STATUS, v);
        }
        if let Some(wait) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&format_delta(wait)) {
                h.insert(http::header::RETRY_AFTER, v);
            }
        }
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }
}

/// Maps any error out of a provider's stack to the refusal to send.
pub fn refusal(err: &BoxError) -> Refusal {
    if let Some(e) = err.downcast_ref::<RateLimited>() {
        return Refusal {
            retry_after: Some(e.retry_after),
            ..Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "http_request_denied",
                "provider rate limit: no pacing slot within the queue wait",
            )
        };
    }
    if let Some(e) = err.downcast_ref::<CircuitOpen>() {
        return Refusal {
            retry_after: Some(e.retry_after),
            ..Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "destination_unavailable",
                "circuit open: provider failing",
            )
        };
    }
    if let Some(e) = err.downcast_ref::<BulkheadFull>() {
        return Refusal {
            retry_after: Some(e.retry_after),
            ..Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "connection_limit_reached",
                "too many requests in flight to this provider",
            )
        };
    }
    if let Some(e) = err.downcast_ref::<RunStopped>() {
        return Refusal::new(
            StatusCode::TOO_MANY_REQUESTS,
            "http_request_denied",
            format!("run stopped: {}", e.reason.label()),
        );
    }
    if err
        .downcast_ref::<tower::timeout::error::Elapsed>()
        .is_some()
    {
        return Refusal::new(
            StatusCode::GATEWAY_TIMEOUT,
            "http_response_timeout",
            "no response head within the attempt timeout",
        );
    }
    if err.downcast_ref::<BodyIdle>().is_some() {
        return Refusal::new(
            StatusCode::GATEWAY_TIMEOUT,
            "http_response_timeout",
            "response body idle",
        );
    }
    if let Some(e) = err.downcast_ref::<Upstream>() {
        let (status, error, details) = match e.kind {
            UpstreamKind::Dns => (StatusCode::BAD_GATEWAY, "dns_error", "name did not resolve"),
            UpstreamKind::ConnectionRefused => (
                StatusCode::BAD_GATEWAY,
                "connection_refused",
                "connection refused",
            ),
            UpstreamKind::ConnectionTimeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "connection_timeout",
                "connect timed out",
            ),
            UpstreamKind::ConnectionClosed => (
                StatusCode::BAD_GATEWAY,
                "connection_terminated",
                "connection closed before a response",
            ),
            UpstreamKind::TlsCertificate => (
                StatusCode::BAD_GATEWAY,
                "tls_certificate_error",
                "upstream certificate not trusted",
            ),
            UpstreamKind::TlsProtocol => (
                StatusCode::BAD_GATEWAY,
                "tls_protocol_error",
                "TLS handshake failed",
            ),
            UpstreamKind::Protocol => (
                StatusCode::BAD_GATEWAY,
                "http_protocol_error",
                "upstream did not speak HTTP",
            ),
            UpstreamKind::Prohibited => (
                StatusCode::FORBIDDEN,
                "destination_ip_prohibited",
                "destination address not allowed",
            ),
            UpstreamKind::ClientBody => (
                StatusCode::BAD_REQUEST,
                "http_request_error",
                "the request body was malformed or cut short",
            ),
        };
        return Refusal::new(status, error, details);
    }
    Refusal::new(
        StatusCode::BAD_GATEWAY,
        "proxy_internal_error",
        "upstream request failed",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_proxy_status_and_retry_after() {
        let err: BoxError = CircuitOpen {
            retry_after: Duration::from_millis(2500),
        }
        .into();
        let resp = refusal(&err).into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(
            resp.headers()[PROXY_STATUS],
            "sluice; error=destination_unavailable; details=\"circuit open: provider failing\""
        );
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "3");
    }

    #[test]
    fn upstream_kinds_map_to_rfc_9209_types() {
        let err: BoxError = Upstream::new(UpstreamKind::Prohibited, "x").into();
        let r = refusal(&err);
        assert_eq!(
            (r.status.as_u16(), r.error),
            (403, "destination_ip_prohibited")
        );
        let err: BoxError = Upstream::new(UpstreamKind::ConnectionRefused, "x").into();
        assert_eq!(refusal(&err).error, "connection_refused");
    }
}
