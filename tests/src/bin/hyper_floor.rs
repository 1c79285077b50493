//! The least a forward proxy built on sluice's HTTP stack does per
//! request: hyper 1's HTTP/1 server, hyper-util's pooled client, tokio's
//! current-thread runtime (sluice's default), and nothing else — no
//! policy, no checks, no metrics. `bench_squid` runs it beside sluice and
//! squid so that sluice's own cost reads as the difference from this
//! floor (issue 24).
//!
//! `hyper_floor ADDR` listens on `ADDR` and runs until killed: it
//! forwards absolute-form requests, and answers `GET /allocations` (origin
//! form) with its allocator's count of allocation requests since start —
//! jemalloc with its statistics, as in the `sluice` binary, so that
//! `bench_squid` counts allocations per request alike on both.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Body = BoxBody<Bytes, hyper::Error>;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: hyper_floor ADDR");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(serve(addr));
}

async fn serve(addr: String) {
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .unwrap_or_else(|e| panic!("cannot listen on {addr}: {e}"));
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let client = client.clone();
                async move { Ok::<_, Infallible>(forward(&client, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: &Client<HttpConnector, Incoming>,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.uri().authority().is_none() && req.uri().path() == "/allocations" {
        let count = allocations().map_or(String::new(), |n| n.to_string());
        return Response::new(
            Full::new(Bytes::from(count))
                .map_err(|e| match e {})
                .boxed(),
        );
    }
    match client.request(req).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(_) => {
            let mut resp = Response::new(Empty::new().map_err(|e| match e {}).boxed());
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            resp
        }
    }
}

/// jemalloc's allocation requests since start (small and large, every
/// arena), this thread's cache emptied first: what
/// `sluice_allocations_total` counts (`sluice::observe::allocator`).
fn allocations() -> Option<u64> {
    use tikv_jemalloc_ctl::{epoch, Access, AsName};
    let tcache = b"thread.tcache.enabled\0".name();
    if Access::<bool>::read(tcache).unwrap_or(false) {
        let _ = tcache.write(false);
        let _ = tcache.write(true);
    }
    epoch::advance().ok()?;
    let small: u64 = b"stats.arenas.4096.small.nrequests\0".name().read().ok()?;
    let large: u64 = b"stats.arenas.4096.large.nrequests\0".name().read().ok()?;
    Some(small + large)
}
