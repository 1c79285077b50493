//! Where a request goes (R-PX1): its target from an absolute-form URI or
//! the tunnel it came through, and the URI and `Host` the upstream gets.

use http::header;
use http::request::Parts;
use http::uri::{Authority, Scheme};
use http::{StatusCode, Uri};

use crate::config::{port_number, without_port, written_port};
use crate::http::edge::{ErrorType, Refusal};

/// A port is written but is not 1 to 65535.
pub(super) fn invalid_port(authority: &Authority) -> bool {
    written_port(authority.as_str()).is_some_and(|p| !matches!(port_number(p), Some(p) if p != 0))
}

/// `authority` without the port when it is `scheme`'s default (`host:443`
/// for https is `host`).
fn without_default_port(scheme: &Scheme, authority: &Authority) -> Authority {
    let default = if *scheme == Scheme::HTTPS { 443 } else { 80 };
    without_port(authority.as_str(), default)
        .and_then(|host| host.parse().ok())
        .unwrap_or_else(|| authority.clone())
}

/// Where a request goes: from its absolute-form URI, or from the CONNECT
/// tunnel it arrived through.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// `host[:port]`, never with userinfo.
    pub authority: Authority,
    /// From the request-target itself (absolute-form), so its authority
    /// replaces any `Host` the client sent (RFC 9112 §3.2.2). Inside a
    /// tunnel the client's `Host` stands.
    pub absolute: bool,
}

impl Target {
    /// The target of an absolute-form request. Userinfo
    /// (`http://user:pass@host/`) is dropped: it must never reach a `Host`
    /// header, a log or the provider.
    pub fn of(uri: &Uri) -> Option<Target> {
        let authority = uri.authority()?;
        // A byte search, not `rsplit_once`'s char searcher: ~350
        // instructions a request for a 15-byte authority (R-PF1).
        let written = authority.as_str();
        let authority = match memchr::memrchr(b'@', written.as_bytes()) {
            Some(at) => written[at + 1..].parse().ok()?,
            // The usual case: nothing to drop, nothing to parse again.
            None => authority.clone(),
        };
        Some(Target {
            scheme: uri.scheme().cloned()?,
            authority,
            absolute: true,
        })
    }

    /// The host, as written (an IPv6 literal keeps its brackets): the
    /// authority without its port — a target's authority has no userinfo,
    /// so this is `Authority::host` without its searches for one.
    pub fn host(&self) -> &str {
        let a = self.authority.as_str();
        written_port(a).map_or(a, |port| &a[..a.len() - port.len() - 1])
    }
}

/// Writes the upstream's URI and `Host` into `parts`: the authority
/// travels in the URI only, without the scheme's default port — hyper-util
/// writes it as `Host` over HTTP/1.1 and as `:authority` over HTTP/2, where
/// a `Host` header beside it is a duplicate that servers such as nginx
/// refuse (RFC 9113 §8.3.1). A target the URI cannot hold is refused.
pub(super) fn address(parts: &mut Parts, target: &Target) -> Result<(), Refusal> {
    let authority = without_default_port(&target.scheme, &target.authority);
    // An absolute-form URI that already says exactly this (no userinfo, no
    // default port) is kept as it came; otherwise it is built again.
    let as_is = target.absolute
        && parts.uri.authority().map(Authority::as_str) == Some(authority.as_str())
        && parts.uri.path_and_query().is_some();
    if !as_is {
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        parts.uri = Uri::builder()
            .scheme(target.scheme.clone())
            .authority(authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|_| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    ErrorType::HttpRequestError,
                    "invalid request target",
                )
            })?;
    }
    // An absolute-form target's authority replaces the client's `Host`
    // (RFC 9112 §3.2.2); inside a tunnel a `Host` naming the target itself
    // is the same authority, written again by the client. Either way it
    // goes, and hyper-util writes the URI's. A tunnelled `Host` naming
    // something else (virtual hosting) stands.
    let redundant = !target.absolute
        && parts.headers.get(header::HOST).is_some_and(|h| {
            h.to_str()
                .ok()
                .and_then(|h| h.parse::<Authority>().ok())
                .is_some_and(|h| {
                    without_default_port(&target.scheme, &h)
                        .as_str()
                        .eq_ignore_ascii_case(authority.as_str())
                })
        });
    if target.absolute || redundant {
        parts.headers.remove(header::HOST);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The written port: after the last `:` outside an IPv6 literal's
    /// brackets, as `Authority::port` reads it.
    #[test]
    fn written_ports() {
        for (authority, port) in [
            ("h.test", None),
            ("h.test:8080", Some("8080")),
            ("h.test:", Some("")),
            ("[::1]", None),
            ("[::1]:443", Some("443")),
            ("127.0.0.1:9", Some("9")),
        ] {
            assert_eq!(written_port(authority), port, "{authority}");
            let parsed: Authority = authority.parse().unwrap();
            assert_eq!(
                crate::config::port_of(authority),
                parsed.port_u16(),
                "{authority}"
            );
        }
    }

    /// A target's host is `Authority::host`'s, userinfo dropped.
    #[test]
    fn a_targets_host_is_its_authoritys() {
        for uri in [
            "http://h.test/x",
            "http://h.test:8080/x",
            "https://user:pw@h.test:8443/",
            "http://[::1]:80/",
            "http://[::1]/",
            "http://127.0.0.1:9/",
            "http://h.test:/",
        ] {
            let uri: Uri = uri.parse().unwrap();
            let t = Target::of(&uri).unwrap();
            assert_eq!(t.host(), uri.host().unwrap(), "{uri}");
            assert!(!t.authority.as_str().contains('@'), "{uri}");
        }
    }

    #[test]
    fn invalid_ports() {
        let a = |s: &str| s.parse::<Authority>().unwrap();
        for bad in [
            "h.test:0",
            "h.test:65536",
            "h.test:70000",
            "[::1]:0",
            "h.test:",
        ] {
            assert!(invalid_port(&a(bad)), "{bad}");
        }
        for good in ["h.test", "h.test:1", "h.test:65535", "[::1]", "[::1]:443"] {
            assert!(!invalid_port(&a(good)), "{good}");
        }
    }

    #[test]
    fn default_ports_are_dropped_from_the_authority() {
        let a = |s: &str| s.parse::<Authority>().unwrap();
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("h.test:443")).as_str(),
            "h.test"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTP, &a("h.test:80")).as_str(),
            "h.test"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("h.test:8443")).as_str(),
            "h.test:8443"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTP, &a("h.test:443")).as_str(),
            "h.test:443"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("[::1]:443")).as_str(),
            "[::1]"
        );
        assert_eq!(
            without_default_port(&Scheme::HTTPS, &a("h.test")).as_str(),
            "h.test"
        );
    }

    #[test]
    fn targets_drop_userinfo() {
        let t = Target::of(&"http://user:secret@api.test:8080/x".parse().unwrap()).unwrap();
        assert_eq!(t.authority.as_str(), "api.test:8080");
        assert!(t.absolute);
        assert!(Target::of(&"/relative".parse().unwrap()).is_none());
    }
}
