//! The headers sluice changes on the way (RFC 9110 §7.6): hop-by-hop
//! headers go, `Via` is added; and the bound on a request head.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::http::body::ResBody;
use crate::http::edge::{ErrorType, Refusal};

/// `Via` value sluice adds (RFC 9110 §7.6.3).
const VIA: &str = "1.1 sluice";

/// Whether `name` belongs to one connection, never forwarded (RFC 9110
/// §7.6.1; besides those named in `Connection`): a `match` on the
/// lower-case name, which compiles to a look at its length and then one
/// comparison — not nine `HeaderName` comparisons for every header of
/// every head (R-PF1, issue 38).
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Removes hop-by-hop headers, including those `Connection` names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names finds those present — most answers have
    // none, a head one or two (`Connection`, a client's
    // `Proxy-Connection`), noted on the stack — and each goes by one
    // look-up: not a pass to decide, a look-up for `Connection` and a pass
    // for each one found (R-PF1, issue 38).
    const NOTED: usize = 4;
    let mut present: [Option<HeaderName>; NOTED] = Default::default();
    let mut found = 0;
    for name in headers.keys().filter(|k| hop_by_hop(k)) {
        if found == NOTED {
            break;
        }
        present[found] = Some(name.clone());
        found += 1;
    }
    for name in present.into_iter().flatten() {
        remove_hop(headers, &name);
    }
    if found == NOTED {
        // More than a head ever has: the rest, a pass each.
        while let Some(name) = headers.keys().find(|k| hop_by_hop(k)).cloned() {
            remove_hop(headers, &name);
        }
    }
}

/// Removes the hop-by-hop header `name`, every value. `Connection` goes
/// in one look-up with all its values, then what it names besides
/// `keep-alive` and `close` (the usual tokens, which name nothing more to
/// remove; no copy in the usual case).
fn remove_hop(headers: &mut HeaderMap, name: &HeaderName) {
    if name != header::CONNECTION {
        headers.remove(name);
        return;
    }
    let header::Entry::Occupied(connection) = headers.entry(header::CONNECTION) else {
        return;
    };
    let mut named: Vec<HeaderName> = Vec::new();
    for value in connection.remove_entry_mult().1 {
        let tokens = value.to_str().unwrap_or_default().split(',').map(str::trim);
        named.extend(
            tokens
                .filter(|t| {
                    !t.eq_ignore_ascii_case("close") && !t.eq_ignore_ascii_case("keep-alive")
                })
                .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
                .filter(|n| !hop_by_hop(n)),
        );
    }
    for name in named {
        headers.remove(name);
    }
}

pub(super) fn add_via(headers: &mut HeaderMap) {
    headers.append(header::VIA, HeaderValue::from_static(VIA));
}

/// Refuses a request head larger than `limit` bytes with 431 (R-SF3).
/// hyper bounds its read buffer, but a head that arrives in one read can
/// pass that bound; this check is exact.
pub fn oversize_head(headers: &HeaderMap, limit: usize) -> Option<Response<ResBody>> {
    let size: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if size > limit {
        let mut resp = Refusal::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ErrorType::HttpRequestError,
            "request headers too large",
        )
        .into_response();
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Some(resp);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-secret-hop".parse().unwrap());
        h.insert("x-secret-hop", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("proxy-authorization", "Basic eA==".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    /// The usual heads — a client's `Proxy-Connection`, an answer's
    /// `Connection: keep-alive` — lose just those, and what a `Connection`
    /// names goes with it, each of its values read.
    #[test]
    fn usual_heads_lose_their_one_or_two() {
        let mut h = HeaderMap::new();
        h.insert("proxy-connection", "Keep-Alive".parse().unwrap());
        h.insert("host", "example.test".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["host"]);

        let mut h = HeaderMap::new();
        h.insert("server", "nginx".parse().unwrap());
        h.append("connection", "keep-alive".parse().unwrap());
        h.append("connection", "X-Hop".parse().unwrap());
        h.insert("x-hop", "1".parse().unwrap());
        h.insert("content-length", "2".parse().unwrap());
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "server"]);
    }

    /// Every hop-by-hop header goes, each value of a repeated one too.
    #[test]
    fn every_hop_by_hop_header_goes_each_value() {
        let mut h = HeaderMap::new();
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
        ] {
            let name = HeaderName::from_static(name);
            h.append(&name, "a".parse().unwrap());
            h.append(&name, "b".parse().unwrap());
        }
        h.insert("x-kept", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("x-kept"));
    }
}
