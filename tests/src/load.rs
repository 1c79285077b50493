//! Closed-loop HTTP/1.1 load for the benches: keep-alive connections
//! sending GETs back to back, with latency percentiles.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What one load run measured.
#[derive(Debug)]
pub struct Run {
    /// Requests answered.
    pub requests: usize,
    /// Requests per second.
    pub rps: f64,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
}

/// `conns` keep-alive connections to `connect_to`, each sending `GET uri`
/// back to back for `secs` seconds; every answer must be 200.
pub async fn load(connect_to: SocketAddr, uri: String, conns: usize, secs: u64) -> Run {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let uri = uri.clone();
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(connect_to).await.expect("connect");
            stream.set_nodelay(true).unwrap();
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let mut latencies = Vec::new();
            while Instant::now() < end {
                let req = Request::get(uri.as_str())
                    .header("host", "bench")
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let t = Instant::now();
                let resp = send.send_request(req).await.expect("request");
                assert_eq!(resp.status(), 200);
                resp.into_body().collect().await.expect("body");
                latencies.push(t.elapsed());
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    Run {
        requests: all.len(),
        rps: all.len() as f64 / secs as f64,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}
