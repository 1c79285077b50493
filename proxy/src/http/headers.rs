//! The headers sluice changes on the way (RFC 9110 §7.6): hop-by-hop
//! headers go, `Via` is added; and the bound on a request head.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};

use crate::http::body::ResBody;
use crate::http::edge::{ErrorType, Refusal};

/// `Via` value sluice adds (RFC 9110 §7.6.3).
const VIA: &str = "1.1 sluice";

/// The headers that belong to one connection, never forwarded (RFC 9110
/// §7.6.1; besides those named in `Connection`).
static HOPS: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Which of [`HOPS`] `name` is, if any: a `match` on the lower-case name,
/// which compiles to a look at its length and then one comparison — not
/// nine `HeaderName` comparisons for every header of every head (R-PF1,
/// issue 38).
fn hop_by_hop(name: &HeaderName) -> Option<usize> {
    Some(match name.as_str() {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "proxy-authenticate" => 3,
        "proxy-authorization" => 4,
        "te" => 5,
        "trailer" => 6,
        "transfer-encoding" => 7,
        "upgrade" => 8,
        _ => return None,
    })
}

/// Removes hop-by-hop headers, including those `Connection` names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names finds those present — most answers have
    // none, a head one or two (`Connection`, a client's
    // `Proxy-Connection`), noted by their place in [`HOPS`], not a copy
    // of their names — and each goes by one look-up: not a pass to
    // decide, a look-up for `Connection` and a pass for each one found
    // (R-PF1, issue 38).
    let mut present = 0u16;
    for hop in headers.keys().filter_map(hop_by_hop) {
        present |= 1 << hop;
    }
    for (hop, name) in HOPS.iter().enumerate() {
        if present & (1 << hop) != 0 {
            remove_hop(headers, name);
        }
    }
}

/// Removes the hop-by-hop header `name`, every value. `Connection` goes
/// in one look-up with all its values, then what it names besides
/// `keep-alive` and `close` (the usual values, which name nothing more to
/// remove: told apart without splitting them into tokens).
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
        let v = value.as_bytes();
        if v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"close") {
            continue;
        }
        let tokens = value.to_str().unwrap_or_default().split(',').map(str::trim);
        named.extend(
            tokens
                .filter(|t| {
                    !t.eq_ignore_ascii_case("close") && !t.eq_ignore_ascii_case("keep-alive")
                })
                .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
                .filter(|n| hop_by_hop(n).is_none()),
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

        // `Close` in any case names nothing more.
        let mut h = HeaderMap::new();
        h.insert("connection", "CLOSE".parse().unwrap());
        h.insert("close", "kept".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), ["close"]);
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
