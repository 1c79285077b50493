//! The one place where a failure becomes an HTTP answer (R-PX4).
//!
//! Every error sluice produces itself — a refusal to protect a provider, a
//! failed connection, a bad request — goes back with the status a client
//! can act on, an RFC 9209 `Proxy-Status` naming the cause, and a
//! `Retry-After` where the wait is known. Details never carry a URL, a
//! path, a header value or a body (R-SF4).

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};
use sluice_policy::classify::retry_after::format_delta;
use sluice_policy::error::{Cause, UpstreamKind};

use crate::http::body::{full, ResBody};

/// The `Proxy-Status` header name (RFC 9209).
pub const PROXY_STATUS: &str = "proxy-status";

/// The RFC 9209 error types sluice's own answers carry in `Proxy-Status`
/// — every one it can send, listed in [`ErrorType::ALL`] (the book's
/// troubleshooting page has a section for each, and a test holds the two
/// together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// sluice will not send this request: a pacing refusal, a hold, a
    /// stopped run, a collector not allowed there, proxy credentials.
    HttpRequestDenied,
    /// The request itself is malformed or unsupported.
    HttpRequestError,
    /// The destination address is not allowed (the destination guard).
    DestinationIpProhibited,
    /// The provider is unavailable: its circuit is open, or it is down.
    DestinationUnavailable,
    /// Too many requests in flight to the provider (the bulkhead).
    ConnectionLimitReached,
    /// The provider refused the connection.
    ConnectionRefused,
    /// The provider closed or reset the connection before answering.
    ConnectionTerminated,
    /// No answer within the request's time.
    ConnectionTimeout,
    /// No response head within an attempt's time.
    HttpResponseTimeout,
    /// The provider's name did not resolve.
    DnsError,
    /// The provider answered with something that is not HTTP.
    HttpProtocolError,
    /// The provider's certificate is not trusted.
    TlsCertificateError,
    /// The TLS handshake with the provider failed.
    TlsProtocolError,
}

impl ErrorType {
    /// Every error type, in the order the troubleshooting page lists them.
    pub const ALL: [ErrorType; 13] = [
        ErrorType::HttpRequestDenied,
        ErrorType::HttpRequestError,
        ErrorType::DestinationIpProhibited,
        ErrorType::DestinationUnavailable,
        ErrorType::ConnectionLimitReached,
        ErrorType::ConnectionRefused,
        ErrorType::ConnectionTerminated,
        ErrorType::ConnectionTimeout,
        ErrorType::HttpResponseTimeout,
        ErrorType::DnsError,
        ErrorType::HttpProtocolError,
        ErrorType::TlsCertificateError,
        ErrorType::TlsProtocolError,
    ];

    /// Its name in `Proxy-Status` (RFC 9209, section 2.3).
    pub fn label(self) -> &'static str {
        match self {
            ErrorType::HttpRequestDenied => "http_request_denied",
            ErrorType::HttpRequestError => "http_request_error",
            ErrorType::DestinationIpProhibited => "destination_ip_prohibited",
            ErrorType::DestinationUnavailable => "destination_unavailable",
            ErrorType::ConnectionLimitReached => "connection_limit_reached",
            ErrorType::ConnectionRefused => "connection_refused",
            ErrorType::ConnectionTerminated => "connection_terminated",
            ErrorType::ConnectionTimeout => "connection_timeout",
            ErrorType::HttpResponseTimeout => "http_response_timeout",
            ErrorType::DnsError => "dns_error",
            ErrorType::HttpProtocolError => "http_protocol_error",
            ErrorType::TlsCertificateError => "tls_certificate_error",
            ErrorType::TlsProtocolError => "tls_protocol_error",
        }
    }
}

impl std::fmt::Display for ErrorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// An answer sluice makes itself.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The status.
    pub status: StatusCode,
    /// The RFC 9209 error type.
    pub error: ErrorType,
    /// A short, fixed description (never request data).
    pub details: String,
    /// When to come back, if known.
    pub retry_after: Option<Duration>,
}

impl Refusal {
    /// A refusal without a wait.
    pub fn new(status: StatusCode, error: ErrorType, details: impl Into<String>) -> Self {
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

/// The answer to a failure out of a provider's stack: status, RFC 9209
/// error type, details and `Retry-After`, decided for every [`Cause`] in
/// one exhaustive `match` (a new cause does not compile until it is
/// answered here).
pub fn refusal(cause: &Cause) -> Refusal {
    let (status, error, details) = match cause {
        Cause::RateLimited(_) => (
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::HttpRequestDenied,
            "provider rate limit: no pacing slot within the queue wait".to_string(),
        ),
        // Opened by the provider's throttles: it is asking to slow down,
        // not failing, and a client told `503` takes it for an outage
        // (issue 35: the openai SDK's `APIStatusError`s) — a `429`.
        Cause::CircuitOpen(e) if e.throttled => (
            StatusCode::TOO_MANY_REQUESTS,
            ErrorType::HttpRequestDenied,
            "circuit open: provider throttling (most recent answers were throttles)".to_string(),
        ),
        Cause::CircuitOpen(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::DestinationUnavailable,
            "circuit open: provider failing".to_string(),
        ),
        // Parked through an outage as long as it may wait: the provider's
        // failures are not passed on, its state is (R-RN13).
        Cause::ProviderDown(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::DestinationUnavailable,
            format!(
                "provider down ({}): every request failing; parked {:.1} s, the most max_outage_wait allows",
                e.reason.label(),
                e.waited.as_secs_f64()
            ),
        ),
        Cause::BulkheadFull(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::ConnectionLimitReached,
            "too many requests in flight to this provider".to_string(),
        ),
        // 403, not 429 or 503: a planned stop is final for the run —
        // clients do not retry a 403, and no client or scheduler takes it
        // for provider pressure and slows down (R-RN3).
        Cause::RunStopped(e) => (
            StatusCode::FORBIDDEN,
            ErrorType::HttpRequestDenied,
            match &e.provider {
                // Only this provider's part of the run stopped (R-RN8).
                Some(p) => format!("run stopped: {} (provider {p})", e.reason.label()),
                None => format!("run stopped: {}", e.reason.label()),
            },
        ),
        Cause::AttemptTimeout => (
            StatusCode::GATEWAY_TIMEOUT,
            ErrorType::HttpResponseTimeout,
            "no response head within the attempt timeout".to_string(),
        ),
        // No answer within the provider's request_timeout, every attempt
        // and wait included: the client is answered instead of waiting on.
        Cause::RequestTimeout(e) => (
            StatusCode::GATEWAY_TIMEOUT,
            ErrorType::ConnectionTimeout,
            format!(
                "request_timeout: no response head after {:.1} s and {} attempts",
                e.after.as_secs_f64(),
                e.attempts
            ),
        ),
        Cause::Upstream(e) => {
            let (status, error, details) = upstream(e.kind);
            let details = match e.kind {
                // A name that resolved only to refused addresses: which
                // one, and the key that allows it.
                UpstreamKind::Prohibited => crate::upstream::guard::prohibited_in(&*e.source)
                    .map_or(details.to_string(), |g| g.to_string()),
                // Why the certificate was not trusted, and what to check.
                UpstreamKind::TlsCertificate => {
                    crate::upstream::causes::find::<rustls::Error>(&*e.source)
                        .map_or(details.to_string(), certificate_details)
                }
                _ => details.to_string(),
            };
            (status, error, details)
        }
    };
    Refusal {
        retry_after: cause.info().retry_after,
        ..Refusal::new(status, error, details)
    }
}

/// An upstream certificate sluice did not trust: rustls's reason, and
/// the key that decides it (issue 36: a self-signed origin certificate in
/// `upstream.extra_ca` failed with no reason anywhere).
fn certificate_details(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    let why = e.to_string();
    let hint = match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "not signed by the bundled web roots nor by upstream.extra_ca (give the CA that signed it)"
        }
        rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "the certificate is not for the host the request names"
        }
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => "the certificate is outside its validity period (or this machine's clock is)",
        // webpki's reason, carried as rustls's `Other`: known only by name.
        _ if why.contains("CaUsedAsEndEntity") => {
            "the server presents a CA certificate as its own: a self-signed server \
             certificate cannot be trusted through upstream.extra_ca; sign one with a CA and give that CA"
        }
        _ => "check upstream.extra_ca",
    };
    format!("upstream certificate not trusted: {why}: {hint}")
}

/// Status, RFC 9209 error type and details of an upstream failure.
fn upstream(kind: UpstreamKind) -> (StatusCode, ErrorType, &'static str) {
    match kind {
        UpstreamKind::Dns => (
            StatusCode::BAD_GATEWAY,
            ErrorType::DnsError,
            "name did not resolve",
        ),
        UpstreamKind::ConnectionRefused => (
            StatusCode::BAD_GATEWAY,
            ErrorType::ConnectionRefused,
            "connection refused",
        ),
        UpstreamKind::ConnectionTimeout => (
            StatusCode::GATEWAY_TIMEOUT,
            ErrorType::ConnectionTimeout,
            "connect timed out",
        ),
        UpstreamKind::ConnectionClosed => (
            StatusCode::BAD_GATEWAY,
            ErrorType::ConnectionTerminated,
            "connection closed before a response",
        ),
        UpstreamKind::TlsCertificate => (
            StatusCode::BAD_GATEWAY,
            ErrorType::TlsCertificateError,
            "upstream certificate not trusted",
        ),
        UpstreamKind::TlsProtocol => (
            StatusCode::BAD_GATEWAY,
            ErrorType::TlsProtocolError,
            "TLS handshake failed",
        ),
        UpstreamKind::Protocol => (
            StatusCode::BAD_GATEWAY,
            ErrorType::HttpProtocolError,
            "upstream did not speak HTTP",
        ),
        UpstreamKind::Prohibited => (
            StatusCode::FORBIDDEN,
            ErrorType::DestinationIpProhibited,
            "destination address not allowed",
        ),
        UpstreamKind::ClientBody => (
            StatusCode::BAD_REQUEST,
            ErrorType::HttpRequestError,
            "the request body was malformed or cut short",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::error::{CircuitOpen, Upstream};

    /// The book's troubleshooting page has a section for every error type
    /// sluice can send, and none for one it cannot (issue 36).
    #[test]
    fn the_troubleshooting_page_lists_every_error_type() {
        let page = include_str!("../../../docs/src/troubleshooting.md");
        let listed: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("## `")?.strip_suffix('`'))
            .collect();
        let sent: Vec<&str> = ErrorType::ALL.iter().map(|e| e.label()).collect();
        assert_eq!(
            listed, sent,
            "docs/src/troubleshooting.md against ErrorType::ALL"
        );
    }

    #[test]
    fn carries_proxy_status_and_retry_after() {
        let err = Cause::CircuitOpen(CircuitOpen {
            retry_after: Duration::from_millis(2500),
            cycle: 1,
            throttled: false,
        });
        let resp = refusal(&err).into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(
            resp.headers()[PROXY_STATUS],
            "sluice; error=destination_unavailable; details=\"circuit open: provider failing\""
        );
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "3");
    }

    /// R-PD3 (issue 35): a circuit opened by the provider's throttles
    /// answers as a throttle — `429`, `Retry-After`, a `Proxy-Status`
    /// naming the pressure — never as an unavailable provider.
    #[test]
    fn a_circuit_opened_by_throttles_answers_as_a_throttle() {
        let err = Cause::CircuitOpen(CircuitOpen {
            retry_after: Duration::from_millis(2500),
            cycle: 1,
            throttled: true,
        });
        let resp = refusal(&err).into_response();
        assert_eq!(resp.status(), 429);
        let status = resp.headers()[PROXY_STATUS].to_str().unwrap();
        assert!(
            status.contains("error=http_request_denied") && status.contains("throttling"),
            "{status}"
        );
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "3");
    }

    /// Issue 36, defect 6: an untrusted certificate's refusal says
    /// rustls's reason and what to check.
    #[test]
    fn an_untrusted_certificate_says_why() {
        use rustls::CertificateError;
        let said = certificate_details(&rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ));
        assert!(
            said.contains("UnknownIssuer") && said.contains("upstream.extra_ca"),
            "{said}"
        );
        let said = certificate_details(&rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        ));
        assert!(said.contains("not for the host"), "{said}");
    }

    #[test]
    fn upstream_kinds_map_to_rfc_9209_types() {
        let err = Cause::Upstream(Upstream::new(UpstreamKind::Prohibited, "x"));
        let r = refusal(&err);
        assert_eq!(
            (r.status.as_u16(), r.error.label()),
            (403, "destination_ip_prohibited")
        );
        let err = Cause::Upstream(Upstream::new(UpstreamKind::ConnectionRefused, "x"));
        assert_eq!(refusal(&err).error.label(), "connection_refused");
    }
}
