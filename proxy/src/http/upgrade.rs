//! HTTP/1.1 Upgrade through sluice (R-PX5): the handshake is one admitted
//! request of the provider's stack; on `101` the two connections are
//! joined and bytes flow both ways until either side closes.

use http::header::{self, HeaderValue};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use crate::app::App;
use crate::http::body::{ResBody, UpstreamBody};
use crate::http::headers::{add_via, strip_hop_by_hop};

/// The protocol an HTTP/1.1 request asks to upgrade to (`Upgrade`, with
/// `upgrade` among its `Connection` tokens), if it does.
pub(super) fn upgrade_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != http::Version::HTTP_11 {
        return None;
    }
    let asks = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

/// The provider switched protocols: answer the client's 101, then carry
/// bytes both ways between the two upgraded connections until either side
/// closes (counted in `sluice_upgrades_total`, open ones in
/// `sluice_upgraded_connections`).
pub(super) fn switch(
    app: &App,
    label: &str,
    mut upstream: Response<UpstreamBody>,
    client: hyper::upgrade::OnUpgrade,
) -> Response<ResBody> {
    let on_upstream = hyper::upgrade::on(&mut upstream);
    let guard = app.metrics.upgraded(label);
    // Like a raw tunnel, an upgraded connection holds SIGTERM's drain (up
    // to the grace): sluice cannot see a message boundary to close it at.
    let tracked = app.shutdown.tracker();
    tokio::spawn(async move {
        let (_open, _tracked) = (guard, tracked);
        match tokio::join!(client, on_upstream) {
            (Ok(c), Ok(u)) => {
                let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
                if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut u).await {
                    tracing::debug!(error = %e, "upgraded connection ended with an error");
                }
            }
            (c, u) => tracing::debug!(
                client = c.is_ok(),
                upstream = u.is_ok(),
                "an upgrade did not complete"
            ),
        }
    });
    let (mut parts, _) = upstream.into_parts();
    let protocol = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    add_via(&mut parts.headers);
    if let Some(p) = protocol {
        parts.headers.insert(header::UPGRADE, p);
    }
    parts
        .headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    parts.version = http::Version::HTTP_11;
    Response::from_parts(
        parts,
        http_body_util::Empty::new().map_err(|e| match e {}).boxed(),
    )
}
