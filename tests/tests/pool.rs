//! The upstream pool under a bound (R-PF1, R-HU2, issue 38): the real
//! binary, a simulator listening on `0.0.0.0` so that every loopback
//! address is a host of its own, and Python requests configured by
//! environment — a broad crawl's pattern: one request to each of many
//! hosts.

use std::time::Duration;

use sluice_tests::clients::{python, python_env};
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::pki::TestCa;
use sluice_tests::sim::Sim;
use tokio::time::Instant;

fn config(max_idle: usize) -> String {
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n[upstream]\nmax_idle_connections = {max_idle}\n"
    )
}

/// GETs each URL in turn through the proxy (one session: the client's own
/// connection to sluice is reused) and prints each status.
const CRAWL: &str = "import sys, requests\ns = requests.Session()\n\
for u in sys.argv[1:]:\n    print(s.get(u, timeout=30).status_code)\n";

async fn crawl(sluice: &Sluice, urls: &[String]) -> Vec<u16> {
    let args: Vec<&str> = urls.iter().map(String::as_str).collect();
    python(&sluice.proxy_url(), CRAWL, &args)
        .await
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

fn host_url(sim: &Sim, n: u32, path: &str) -> String {
    format!("http://127.3.0.{n}:{}{path}", sim.addr.port())
}

/// Waits (up to 10 s) until the simulator has at most `max` connections
/// open: a close reaches it as a FIN, a moment after sluice decides it.
async fn settle_to(sim: &Sim, max: u64) -> (u64, u64) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let c = sim.connections();
        if c.1 <= max || Instant::now() > until {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One GET to each of 40 hosts under `max_idle_connections = 8`: every
/// answer 200, 8 idle connections left open at the provider, 32 closed
/// and counted — and the 8 kept are the most recently used hosts' (a
/// request to the last host reuses its connection; one to the first
/// makes a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_beyond_the_bound_are_closed_least_recently_used_first() {
    let sim = Sim::start("0.0.0.0").await;
    let sluice = Sluice::start(&config(8));
    let urls: Vec<String> = (1..=40).map(|n| host_url(&sim, n, "/ok")).collect();
    let statuses = crawl(&sluice, &urls).await;
    assert_eq!(statuses, vec![200; 40]);
    let (accepted, open) = settle_to(&sim, 8).await;
    assert_eq!(accepted, 40, "one connection per host");
    assert_eq!(open, 8, "the bound's connections stay open at the provider");
    assert_eq!(
        sluice.metric("sluice_upstream_connections").await,
        Some(8.0)
    );
    assert_eq!(
        sluice.metric("sluice_upstream_idle_closed_total").await,
        Some(32.0)
    );
    // The last host's connection was kept: reused, nothing new accepted.
    assert_eq!(
        crawl(&sluice, &[host_url(&sim, 40, "/ok")]).await,
        vec![200]
    );
    assert_eq!(sim.connections().0, 40, "host 40's connection reused");
    // The first host's was closed: a new one, and the bound still holds.
    assert_eq!(crawl(&sluice, &[host_url(&sim, 1, "/ok")]).await, vec![200]);
    assert_eq!(sim.connections().0, 41, "host 1 connects again");
    let (_, open) = settle_to(&sim, 8).await;
    assert_eq!(open, 8);
}

/// A connection waiting for a slow answer carries no traffic, like an
/// idle one, but it is in use: not listed idle, never closed for the
/// bound. Under a bound of 2, an 8 s answer from one host survives 30 other hosts' requests made
/// meanwhile, and a host used back to back keeps its one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_awaiting_an_answer_is_never_closed_for_the_bound() {
    let sim = Sim::start("0.0.0.0").await;
    let sluice = Sluice::start(&config(2));
    let slow_url = format!("http://127.3.1.1:{}/slow/8000", sim.addr.port());
    let slow = {
        let proxy = sluice.proxy_url();
        tokio::spawn(async move { python(&proxy, CRAWL, &[&slow_url]).await })
    };
    // The slow request is in flight before the others start.
    let until = Instant::now() + Duration::from_secs(10);
    while sim.hits("/slow").is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sim.hits("/slow").len(),
        1,
        "the slow request reached the host"
    );
    let others: Vec<String> = (1..=30).map(|n| host_url(&sim, n, "/ok")).collect();
    assert_eq!(crawl(&sluice, &others).await, vec![200; 30]);
    assert!(
        sim.hits("/slow").len() == 1 && !slow.is_finished(),
        "the 30 requests took less than the slow answer's 8 s"
    );
    assert_eq!(slow.await.unwrap().trim(), "200", "the slow answer arrived");
    // A host used back to back: one connection for ten requests.
    let before = sim.connections().0;
    let again: Vec<String> = (0..10).map(|_| host_url(&sim, 77, "/ok")).collect();
    assert_eq!(crawl(&sluice, &again).await, vec![200; 10]);
    assert_eq!(sim.connections().0, before + 1);
}

/// Answers sluice does not pass on — a `429` whose `Retry-After` it waits
/// out, `503`s it retries — give their connection back like any other: the
/// retries reach the provider on the same connection, as with hyper-util's
/// pool. (Their short bodies are read ahead for the provider's dialect, so
/// they end; a longer one dropped unread is handed back once hyper has
/// drained it — `Checkin`'s drop — where it was closed before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_sluice_retries_gives_its_connection_back() {
    let sim = Sim::start("0.0.0.0").await;
    let sluice = Sluice::start(&config(8));
    let refused_once = format!("http://127.3.2.1:{}/ra/1/pool", sim.addr.port());
    let failing = format!("http://127.3.2.2:{}/fail503/2/pool", sim.addr.port());
    assert_eq!(crawl(&sluice, &[refused_once]).await, vec![200]);
    assert_eq!(sim.hits("/ra/1/pool").len(), 2, "refused, then sent again");
    assert_eq!(sim.connections().0, 1, "both on one connection");
    assert_eq!(crawl(&sluice, &[failing]).await, vec![200]);
    assert_eq!(sim.hits("/fail503/2/pool").len(), 3, "two 503s retried");
    assert_eq!(
        sim.connections().0,
        2,
        "one connection for that host's three"
    );
}

/// Idle connections past the most recently used 32 rest: hyper lets go
/// of them and sluice keeps the socket alone (issue 38's "buffers given
/// back when idle"). Under the default bound, one GET to each of 40 hosts
/// leaves all 40 open at the provider, 8 of them resting; a request to
/// the first host (the oldest, resting) is sent on its connection — no
/// new one accepted — and so is one to the last (ready). When the
/// provider restarts, closing every connection, a request meeting a
/// resting connection the server closed is answered `200` on a new one,
/// never an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_recent_few_rest_as_sockets_and_serve_again() {
    let mut sim = Sim::start("0.0.0.0").await;
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let urls: Vec<String> = (1..=40).map(|n| host_url(&sim, n, "/ok")).collect();
    assert_eq!(crawl(&sluice, &urls).await, vec![200; 40]);
    let (accepted, open) = sim.connections();
    assert_eq!((accepted, open), (40, 40), "every connection kept open");
    // Resting is the connection task's last step: it lists the socket
    // again a moment after the 33rd idle one pushed it out.
    let until = Instant::now() + Duration::from_secs(10);
    while sluice.metric("sluice_upstream_connections_resting").await != Some(8.0)
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        sluice.metric("sluice_upstream_connections_resting").await,
        Some(8.0),
        "all but the 32 most recently used rest"
    );
    assert_eq!(
        sluice.metric("sluice_upstream_connections").await,
        Some(40.0)
    );
    // The oldest, resting: taken again, a new dispatcher on its socket.
    assert_eq!(crawl(&sluice, &[host_url(&sim, 1, "/ok")]).await, vec![200]);
    assert_eq!(
        sim.connections().0,
        40,
        "host 1's resting connection reused"
    );
    assert_eq!(
        crawl(&sluice, &[host_url(&sim, 40, "/ok")]).await,
        vec![200]
    );
    assert_eq!(sim.connections().0, 40, "host 40's ready connection reused");
    // The provider restarts: every connection closed under sluice.
    sim.stop();
    settle_to(&sim, 0).await;
    sim.restart().await;
    let again = [host_url(&sim, 2, "/ok"), host_url(&sim, 39, "/ok")];
    assert_eq!(crawl(&sluice, &again).await, vec![200, 200]);
    assert_eq!(sim.connections().0, 42, "two new connections, no errors");
}

/// 40 HTTPS hosts (`127.3.5.1`–`.40`) on one TLS simulator on `0.0.0.0`
/// offering `alpn`, and a sluice intercepting them.
struct TlsHosts {
    sim: Sim,
    sluice: Sluice,
    port: u16,
    _dir: TempDir,
}

impl TlsHosts {
    async fn start(alpn: &[&[u8]]) -> TlsHosts {
        let ca = TestCa::new("provider CA");
        let dir = TempDir::new("pool-tls");
        std::fs::write(dir.join("provider-ca.pem"), &ca.pem).unwrap();
        let ips: Vec<String> = (1..=40).map(|n| format!("127.3.5.{n}")).collect();
        let names: Vec<&str> = ips.iter().map(String::as_str).collect();
        let mut tls = (*ca.server_config(&names)).clone();
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let sim = Sim::start_tls("0.0.0.0", std::sync::Arc::new(tls)).await;
        let port = sim.addr.port();
        let sluice = Sluice::start(&format!(
            "[destinations]\nallow = [\"127.0.0.0/8\"]\nconnect_ports = [{port}]\n\
             [upstream]\nextra_ca = \"{}\"\n",
            dir.join("provider-ca.pem").display()
        ));
        TlsHosts {
            sim,
            sluice,
            port,
            _dir: dir,
        }
    }

    fn url(&self, n: u32) -> String {
        format!("https://127.3.5.{n}:{}/ok", self.port)
    }

    /// GETs each host through `CONNECT`, Python requests trusting
    /// sluice's CA: each status.
    async fn get(&self, hosts: impl IntoIterator<Item = u32>) -> Vec<u16> {
        let urls: Vec<String> = hosts.into_iter().map(|n| self.url(n)).collect();
        let args: Vec<&str> = urls.iter().map(String::as_str).collect();
        let bundle = self.sluice.dir.join("state").join("ca.crt");
        let bundle = bundle.display().to_string();
        python_env(
            &self.sluice.proxy_url(),
            CRAWL,
            &args,
            &[("REQUESTS_CA_BUNDLE", &bundle)],
        )
        .await
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
    }

    /// Waits (up to 10 s) for a metric to read `want`; what it read.
    async fn metric_reaches(&self, name: &str, want: f64) -> Option<f64> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.sluice.metric(name).await;
            if v == Some(want) || Instant::now() > until {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The same over TLS, as an intercepted HTTPS crawl meets it: one GET to
/// each of 40 HTTPS hosts speaking HTTP/1.1 through `CONNECT` leaves 8
/// upstream TLS connections resting, and a request to the first host is
/// answered on its resting connection — its TLS session kept, no new
/// connection accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resting_tls_connections_keep_their_session_and_serve_again() {
    let h = TlsHosts::start(&[b"http/1.1"]).await;
    assert_eq!(h.get(1..=40).await, vec![200; 40]);
    assert_eq!(h.sim.connections(), (40, 40), "every connection kept open");
    assert_eq!(
        h.metric_reaches("sluice_upstream_connections_resting", 8.0)
            .await,
        Some(8.0)
    );
    assert_eq!(h.get([1]).await, vec![200]);
    assert_eq!(
        h.sim.connections().0,
        40,
        "host 1's resting TLS connection reused"
    );
}

/// An HTTP/2 connection cannot rest (its server's PINGs and SETTINGS want
/// answers): past the 32 most recently used, one is closed once its
/// streams end. 40 HTTPS hosts speaking HTTP/2: 32 connections left open
/// at the provider, 8 closed and counted, none resting; the last host's
/// kept (reused), the first's made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_past_the_recent_few_are_closed() {
    let h = TlsHosts::start(&[b"h2", b"http/1.1"]).await;
    assert_eq!(h.get(1..=40).await, vec![200; 40]);
    let (accepted, open) = settle_to(&h.sim, 32).await;
    assert_eq!((accepted, open), (40, 32), "8 closed at the provider");
    assert_eq!(
        h.metric_reaches("sluice_upstream_idle_closed_total", 8.0)
            .await,
        Some(8.0)
    );
    assert_eq!(
        h.sluice.metric("sluice_upstream_connections").await,
        Some(32.0)
    );
    assert_eq!(
        h.sluice.metric("sluice_upstream_connections_resting").await,
        Some(0.0)
    );
    assert_eq!(h.get([40]).await, vec![200]);
    assert_eq!(h.sim.connections().0, 40, "host 40's connection reused");
    assert_eq!(h.get([1]).await, vec![200]);
    assert_eq!(h.sim.connections().0, 41, "host 1 connects again");
}
