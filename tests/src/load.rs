//! Closed-loop HTTP/1.1 load for the benches: keep-alive connections
//! sending GETs back to back, with latency percentiles.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
            drive(stream, &uri, "bench", end).await
        }));
    }
    collect(tasks, secs).await
}

/// Like [`load`], through an HTTPS proxy tunnel on every connection:
/// `CONNECT authority` to `proxy`, TLS inside it trusting only `trust`
/// (the intercepting proxy's CA, PEM) for `server_name`, then `GET path`
/// back to back on the kept-alive connection (HTTP/1.1).
pub async fn load_tunnelled(
    proxy: SocketAddr,
    authority: &str,
    server_name: &str,
    trust: &str,
    path: &str,
    conns: usize,
    secs: u64,
) -> Run {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(trust) {
        roots.add(cert).expect("a CA certificate");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (tls, name) = (tls.clone(), name.clone());
        let (authority, path) = (authority.to_string(), path.to_string());
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(proxy).await.expect("connect");
            stream.set_nodelay(true).unwrap();
            stream
                .write_all(
                    format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes(),
                )
                .await
                .unwrap();
            // The proxy's answer, byte by byte up to its blank line: what
            // follows is the TLS server's.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                stream.read_exact(&mut byte).await.expect("CONNECT answer");
                head.push(byte[0]);
            }
            let status = String::from_utf8_lossy(&head);
            assert!(
                status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200"),
                "CONNECT refused: {status}"
            );
            let stream = tls
                .connect(name, stream)
                .await
                .expect("TLS through the proxy");
            drive(stream, &path, &authority, end).await
        }));
    }
    collect(tasks, secs).await
}

fn rustls_pemfile_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.expect("PEM certificate"))
        .collect()
}

/// One kept-alive connection sending `GET uri` back to back until `end`.
async fn drive<T>(io: T, uri: &str, host: &str, end: Instant) -> Vec<Duration>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut latencies = Vec::new();
    while Instant::now() < end {
        let req = Request::get(uri)
            .header("host", host)
            .body(Empty::<Bytes>::new())
            .unwrap();
        let t = Instant::now();
        let resp = send.send_request(req).await.expect("request");
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.expect("body");
        latencies.push(t.elapsed());
    }
    latencies
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>, secs: u64) -> Run {
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

/// `wrk` (Debian's) with `conns` connections on `threads` threads for
/// `secs` seconds against `connect_to`; with `absolute`, every request
/// is `GET absolute` in absolute form (through a forward proxy). Panics
/// on a non-2xx answer or a socket error.
pub fn wrk(
    connect_to: SocketAddr,
    absolute: Option<&str>,
    conns: usize,
    threads: usize,
    secs: u64,
) -> Run {
    let dir = crate::harness::TempDir::new("wrk");
    let mut cmd = std::process::Command::new("wrk");
    cmd.arg(format!("-t{threads}"))
        .arg(format!("-c{conns}"))
        .arg(format!("-d{secs}s"))
        .arg("--latency");
    if let Some(uri) = absolute {
        let script = dir.join("absolute.lua");
        std::fs::write(&script, format!("wrk.path = \"{uri}\"\n")).unwrap();
        cmd.arg("-s").arg(script);
    }
    cmd.arg(format!("http://{connect_to}/ok"));
    let out = cmd.output().expect("wrk (Debian's wrk)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "wrk failed: {text}");
    assert!(
        !text.contains("Non-2xx") && !text.contains("Socket errors"),
        "wrk saw errors: {text}"
    );
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let latency = |pct: &str| {
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with(pct))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(parse_wrk_duration)
            .unwrap_or_default()
    };
    Run {
        requests,
        rps: requests as f64 / secs as f64,
        p50: latency("50%"),
        p99: latency("99%"),
    }
}

/// `437.00us`, `1.88ms`, `2.01s` as wrk prints them.
fn parse_wrk_duration(s: &str) -> Option<Duration> {
    let (n, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s.strip_suffix('s')?, 1.0)
    };
    Some(Duration::from_secs_f64(n.parse::<f64>().ok()? * scale))
}

/// A kept-alive HTTP/1.1 connection to the proxy at `proxy`.
pub async fn proxy_sender(
    proxy: SocketAddr,
) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// POSTs to `url` (absolute: a proxy request) over `send`; the status,
/// the body read to its end, within 20 s.
pub async fn post(
    send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    url: &str,
) -> u16 {
    let req = Request::post(url).body(Empty::<Bytes>::new()).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
        .await
        .expect("an answer within 20 s")
        .unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

/// One POST to `/ok` on `port` of each of `n` loopback addresses from
/// `first` on, over `conns` kept-alive connections, each answered
/// `expect` within 20 s.
pub async fn one_post_to_each(
    proxy: SocketAddr,
    first: std::net::Ipv4Addr,
    port: u16,
    n: u32,
    conns: u32,
    expect: u16,
) {
    one_post_to_each_at(proxy, (first, port, "/ok"), n, conns, expect).await
}

/// [`one_post_to_each`] to `path`: one POST to `path` on `port` of each of
/// `n` loopback addresses from `first` on.
pub async fn one_post_to_each_at(
    proxy: SocketAddr,
    (first, port, path): (std::net::Ipv4Addr, u16, &'static str),
    n: u32,
    conns: u32,
    expect: u16,
) {
    let per = n.div_ceil(conns);
    let mut tasks = Vec::new();
    for c in 0..conns {
        tasks.push(tokio::spawn(async move {
            let mut send = proxy_sender(proxy).await;
            for i in (c * per)..((c + 1) * per).min(n) {
                let ip = std::net::Ipv4Addr::from(u32::from(first) + i);
                let status = post(&mut send, &format!("http://{ip}:{port}{path}")).await;
                assert_eq!(status, expect, "{ip}:{port}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
