//! Floods (issue 20, R-HU1): idle client connections, raw `CONNECT`
//! tunnels and intercepted ones, by the thousand, on this machine.
//!
//! `cargo build --release -p sluice -p sluice-tests --bins && \
//!  SLUICE_BIN=target/release/sluice target/release/bench_flood [IDLE] [TUNNELS] [ROUNDS]`
//!
//! The real binary, three phases, each from sluice's resident set at rest:
//! `IDLE` (10,000) connections that send nothing; `TUNNELS` (5,000) raw
//! tunnels to an echo server (`intercept = false`: sluice holds both
//! sides); `TUNNELS` intercepted tunnels, each a TLS session with sluice's
//! CA. For each: memory per connection or tunnel, descriptors, the admin
//! port's answer time while they are open (the worst of a few), one
//! request through the flood still served, and the resident set after
//! they all closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::pki::TestCa;
use sluice_tests::procfs::{open_fds, rss_kib};
use sluice_tests::sim::Sim;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// The admin port's answer time to `/healthz` (worst of five).
async fn admin_worst(admin: SocketAddr) -> Duration {
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        let mut s = TcpStream::connect(admin).await.expect("admin");
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        assert!(
            buf.starts_with(b"HTTP/1.1 200"),
            "admin: {}",
            String::from_utf8_lossy(&buf)
        );
        worst = worst.max(t.elapsed());
    }
    worst
}

/// Waits (bounded) until sluice holds at least `want` descriptors.
async fn until_fds(pid: u32, want: usize) {
    let t = Instant::now();
    while open_fds(pid) < want && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A CONNECT to `target` through the proxy; the stream once sluice said 200.
async fn connect(proxy: SocketAddr, target: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.expect("connect proxy");
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "CONNECT answered");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

struct Phase {
    name: &'static str,
    count: usize,
    before: u64,
    during: u64,
    after: u64,
    fds: usize,
    fds_after: usize,
    settled: Duration,
    admin: Duration,
    took: Duration,
}

impl Phase {
    /// Once the clients closed: waits (bounded) for sluice's descriptors
    /// to fall back to `rest`, then prints.
    #[allow(clippy::too_many_arguments)]
    async fn after(
        pid: u32,
        rest: usize,
        name: &'static str,
        count: usize,
        before: u64,
        during: u64,
        fds_open: usize,
        admin: Duration,
        took: Duration,
    ) {
        let t = Instant::now();
        while open_fds(pid) > rest && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The allocator gives freed memory back over seconds: wait
        // (bounded, 20 s) for the resident set to come within 10 % of where
        // it was.
        let closed = Instant::now();
        while rss_kib(pid) as f64 > before as f64 * 1.1
            && closed.elapsed() < Duration::from_secs(20)
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let settled = closed.elapsed();
        let phase = Phase {
            settled,
            name,
            count,
            before,
            during,
            after: rss_kib(pid),
            fds: fds_open,
            fds_after: open_fds(pid),
            admin,
            took,
        };
        phase.print();
    }

    fn print(&self) {
        let per = self.during.saturating_sub(self.before) as f64 * 1024.0 / self.count as f64;
        println!(
            "{}: {} open in {:.1} s ({} descriptors in sluice): RSS {} → {} KiB, {:.0} bytes ({:.1} KiB) each; \
             admin /healthz at worst {:.1} ms meanwhile; after closing {} descriptors, {} KiB {:.1} s later ({:+.1} % of the rest before)",
            self.name,
            self.count,
            self.took.as_secs_f64(),
            self.fds,
            self.before,
            self.during,
            per,
            per / 1024.0,
            self.admin.as_secs_f64() * 1000.0,
            self.fds_after,
            self.after,
            self.settled.as_secs_f64(),
            (self.after as f64 / self.before as f64 - 1.0) * 100.0
        );
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let idle: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let tunnels: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5_000);
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    // Raw tunnels' far side: an echo server that holds what it accepts.
    let echo = TcpListener::bind("127.0.3.21:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let provider_ca = TestCa::new("flood provider CA");
    let tls_sim = Sim::start_tls("127.0.3.22", provider_ca.server_config(&["127.0.3.22"])).await;
    let plain_sim = Sim::start("127.0.3.23").await;
    let dir = TempDir::new("flood");
    std::fs::write(dir.join("provider-ca.pem"), &provider_ca.pem).unwrap();
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\nconnect_ports = [{}, {}]\n\
         [upstream]\nextra_ca = \"{}\"\n\
         [limits]\nheader_read_timeout = \"600s\"\n\
         [providers.raw]\nhosts = [\"127.0.3.21\"]\nintercept = false\nceiling_rps = 100000.0\n\
         start_rps = 50000.0\nmax_queue_len = 20000\nmax_in_flight = 20000\n\
         [providers.tls]\nhosts = [\"127.0.3.22\"]\nceiling_rps = 1000.0\n",
        echo_addr.port(),
        tls_sim.addr.port(),
        dir.join("provider-ca.pem").display()
    );
    let sluice = Sluice::start_in(dir, &config);
    let (pid, proxy, admin) = (sluice.pid(), sluice.proxy, sluice.admin);
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "bench_flood: sluice pid {pid}, {} descriptors at rest, RSS {} KiB",
        open_fds(pid),
        rss_kib(pid)
    );

    let ca = CertificateDer::from_pem_file(sluice.dir.join("state").join("ca.crt"))
        .expect("sluice's CA");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = ServerName::try_from("127.0.3.22").unwrap();
    // Again and again: later rounds show whether memory kept after the
    // first is reused (the allocator's) or keeps growing (a leak).
    for round in 1..=rounds {
        println!("round {round}");
        // 1. Idle client connections.
        let rest = open_fds(pid);
        let before = rss_kib(pid);
        let t = Instant::now();
        let mut conns = Vec::with_capacity(idle);
        for _ in 0..idle {
            conns.push(TcpStream::connect(proxy).await.expect("connect"));
        }
        until_fds(pid, rest + idle).await;
        let took = t.elapsed();
        let (during, fds_open, admin_t) = (rss_kib(pid), open_fds(pid), admin_worst(admin).await);
        let r = sluice_tests::clients::curl(
            &sluice.proxy_url(),
            &[],
            &plain_sim.url("http", "/ok"),
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            r.status, 200,
            "a request through the flood of idle connections"
        );
        drop(conns);
        Phase::after(
            pid,
            rest,
            "idle connections",
            idle,
            before,
            during,
            fds_open,
            admin_t,
            took,
        )
        .await;

        // 2. Raw tunnels (sluice holds the client side and the provider side).
        let target = echo_addr.to_string();
        let rest = open_fds(pid);
        let before = rss_kib(pid);
        let t = Instant::now();
        let mut open = Vec::with_capacity(tunnels);
        for _ in 0..tunnels {
            open.push(connect(proxy, &target).await);
        }
        until_fds(pid, rest + 2 * tunnels).await;
        let took = t.elapsed();
        let (during, fds_open, admin_t) = (rss_kib(pid), open_fds(pid), admin_worst(admin).await);
        // Bytes still flow through one of them (a TLS record's first byte:
        // plain text in a tunnel is served as HTTP, not carried raw).
        let s = open.last_mut().unwrap();
        s.write_all(b"\x16ping").await.unwrap();
        let mut back = [0u8; 5];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"\x16ping");
        drop(open);
        Phase::after(
            pid,
            rest,
            "raw CONNECT tunnels",
            tunnels,
            before,
            during,
            fds_open,
            admin_t,
            took,
        )
        .await;

        // 3. Intercepted tunnels: a TLS session with sluice each.
        let target = tls_sim.addr.to_string();
        let rest = open_fds(pid);
        let before = rss_kib(pid);
        let t = Instant::now();
        let mut open = Vec::with_capacity(tunnels);
        for _ in 0..tunnels {
            let s = connect(proxy, &target).await;
            open.push(tls.connect(name.clone(), s).await.expect("TLS with sluice"));
        }
        until_fds(pid, rest + tunnels).await;
        let took = t.elapsed();
        let (during, fds_open, admin_t) = (rss_kib(pid), open_fds(pid), admin_worst(admin).await);
        // A request inside one of them reaches the provider.
        let s = open.last_mut().unwrap();
        s.write_all(b"GET /ok HTTP/1.1\r\nhost: 127.0.3.22\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer).await;
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "a request inside an intercepted tunnel"
        );
        drop(open);
        Phase::after(
            pid,
            rest,
            "intercepted CONNECT tunnels",
            tunnels,
            before,
            during,
            fds_open,
            admin_t,
            took,
        )
        .await;
    }
}
