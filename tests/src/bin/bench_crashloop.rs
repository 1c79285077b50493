//! `kill -9` during heavy state writes, again and again (issue 20, R-PS2,
//! R-RN5, R-RN10): the store must always open, and nothing sluice
//! answered as durable may be lost.
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice \
//!  cargo run --release -p sluice-tests --bin bench_crashloop [ROUNDS] [SEED]`
//!
//! One state directory, `ROUNDS` (50) lives of the real binary. In each,
//! at once and as fast as they go: checkpoint commits of a run on four
//! streams (answered `200` only once flushed), gap records posted by the
//! collector (`201` once flushed), traffic to a provider (learned state
//! saved every 100 ms) and to a dead one whose breaker opens and
//! half-opens every 200 ms (evidence flushed per transition). After a
//! random 0.2–1.5 s, `kill -9`. The next life must start on the same
//! store (no cold start), resume the run, and hold every checkpoint at
//! least as far as the last one answered `200`, and every gap answered
//! `201`. Prints one line per life and a summary; exits non-zero on any
//! loss.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_tests::harness::{try_api_call, Sluice, TempDir};
use sluice_tests::sim::Sim;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const TOKEN: &str = "crashloop-token";
const STREAMS: usize = 4;

/// What sluice answered as durable, across all lives.
#[derive(Default)]
struct Acked {
    /// Per stream, the highest slice answered `200`.
    slices: BTreeMap<String, u64>,
    /// Gap ids answered `201`.
    gaps: BTreeSet<String>,
    commits: u64,
    /// Proxied answers by status.
    proxied: BTreeMap<u16, u64>,
}

/// A tiny xorshift, seeded: a run of the bench can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

async fn api(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Option<(u16, Value)> {
    try_api_call(admin, method, path, body.as_ref(), None)
        .await
        .ok()
}

/// One GET through the proxy as the collector; the status, if answered.
async fn proxied(proxy: SocketAddr, target: &str) -> Option<u16> {
    let mut s = TcpStream::connect(proxy).await.ok()?;
    // collector-b:crashloop-token-b, as `Proxy-Authorization: Basic`:
    // traffic outside the run (collector-a's), so the dead provider's
    // breaker cycles without stopping the run's part of it.
    let auth = "Y29sbGVjdG9yLWI6Y3Jhc2hsb29wLXRva2VuLWI=";
    let host = target.trim_start_matches("http://").split('/').next()?;
    let req = format!(
        "GET {target} HTTP/1.1\r\nhost: {host}\r\nproxy-authorization: Basic {auth}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    std::str::from_utf8(buf.get(9..12)?).ok()?.parse().ok()
}

/// The collector's active run (resumed after a `kill -9`), or a new one.
async fn the_run(admin: SocketAddr) -> (String, u64) {
    let (_, c) = api(admin, "GET", "/v1/collectors/collector-a", None)
        .await
        .expect("the admin answers after a restart");
    if let (Some(id), Some(fence)) = (
        c["active_run"]["id"].as_str(),
        c["active_run"]["lease"]["fencing_token"].as_u64(),
    ) {
        return (id.to_string(), fence);
    }
    let (s, run) = api(
        admin,
        "POST",
        "/v1/collectors/collector-a/runs",
        Some(json!({ "wait_s": 5 })),
    )
    .await
    .expect("open a run");
    assert_eq!(s, 201, "{run}");
    (
        run["id"].as_str().unwrap().to_string(),
        run["lease"]["fencing_token"].as_u64().unwrap(),
    )
}

/// Every pending gap id (all pages).
async fn gap_ids(admin: SocketAddr) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/collectors/collector-a/gaps?after={a}"),
            None => "/v1/collectors/collector-a/gaps".to_string(),
        };
        let (s, page) = api(admin, "GET", &path, None).await.expect("gaps");
        assert_eq!(s, 200, "{page}");
        for g in page["gaps"].as_array().unwrap() {
            ids.insert(g["id"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(n) if page["drained"] != true => after = Some(n.to_string()),
            _ => return ids,
        }
    }
}

/// Checks that everything answered as durable is there; returns the
/// stored slices to go on from.
async fn verify(admin: SocketAddr, acked: &Acked) -> Result<BTreeMap<String, u64>, String> {
    let (s, list) = api(admin, "GET", "/v1/collectors/collector-a/checkpoints", None)
        .await
        .ok_or("no checkpoint list")?;
    if s != 200 {
        return Err(format!("checkpoints: {s} {list}"));
    }
    let mut stored = BTreeMap::new();
    for (stream, want) in &acked.slices {
        let have = list["checkpoints"]["steady"][stream]["slice"]
            .as_u64()
            .unwrap_or(0);
        if have < *want {
            return Err(format!(
                "{stream}: slice {have} stored, {want} was answered 200"
            ));
        }
        stored.insert(stream.clone(), have);
    }
    let ids = gap_ids(admin).await;
    let lost: Vec<_> = acked.gaps.difference(&ids).collect();
    if !lost.is_empty() {
        return Err(format!(
            "{} gaps answered 201 are gone: {lost:?}",
            lost.len()
        ));
    }
    Ok(stored)
}

/// One life's writers, until the process is gone.
async fn write_hard(
    admin: SocketAddr,
    proxy: SocketAddr,
    busy: String,
    dead: String,
    acked: Arc<Mutex<Acked>>,
    mut next: BTreeMap<String, u64>,
) {
    let (id, fence) = the_run(admin).await;
    let mut tasks = Vec::new();
    for k in 0..STREAMS {
        let (id, acked) = (id.clone(), acked.clone());
        let stream = format!("s{k}");
        let mut slice = next.remove(&stream).unwrap_or(0);
        tasks.push(tokio::spawn(async move {
            loop {
                slice += 1;
                let body = json!({ "mode": "steady", "slice": slice, "cursor": format!("c{slice}"), "fencing_token": fence });
                match api(admin, "PUT", &format!("/v1/runs/{id}/checkpoints/{stream}"), Some(body)).await {
                    Some((200, _)) => {
                        let mut a = acked.lock().unwrap();
                        a.commits += 1;
                        let e = a.slices.entry(stream.clone()).or_default();
                        *e = (*e).max(slice);
                    }
                    Some((503, _)) => tokio::time::sleep(Duration::from_millis(20)).await,
                    Some((s, v)) => panic!("commit {stream} {slice}: {s} {v}"),
                    None => return,
                }
            }
        }));
    }
    {
        let (id, acked) = (id.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0u64.. {
                let body = json!({ "stream": format!("s{}", n % STREAMS as u64), "cursor": format!("g{n}"), "reason": "upstream_error" });
                match api(admin, "POST", &format!("/v1/runs/{id}/gaps"), Some(body)).await {
                    Some((201, g)) => {
                        acked.lock().unwrap().gaps.insert(g["id"].as_str().unwrap().to_string());
                    }
                    Some((503, _)) => tokio::time::sleep(Duration::from_millis(20)).await,
                    Some((s, v)) => panic!("gap: {s} {v}"),
                    None => return,
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for target in [busy, dead] {
        for _ in 0..2 {
            let (target, acked) = (target.clone(), acked.clone());
            tasks.push(tokio::spawn(async move {
                while let Some(status) = proxied(proxy, &target).await {
                    *acked.lock().unwrap().proxied.entry(status).or_default() += 1;
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1
    });
    let mut rng = Rng(seed);
    let sim = Sim::start("127.0.3.1").await;
    let dead_port = std::net::TcpListener::bind("127.0.3.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempDir::new("crashloop");
    std::fs::write(dir.join("a.token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(dir.join("b.token"), "crashloop-token-b\n").unwrap();
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [limits]\nsave_interval = \"100ms\"\n\
         [collectors.collector-a]\ntoken_file = \"{}\"\n\
         [collectors.collector-b]\ntoken_file = \"{}\"\n\
         [providers.busy]\nhosts = [\"127.0.3.1\"]\nceiling_rps = 500.0\n\
         [providers.dead]\nhosts = [\"127.0.3.2\"]\nbreaker_min_calls = 4\n\
         breaker_open_for = \"200ms\"\nbreaker_half_open_probes = 1\nretry_max_attempts = 1\n",
        dir.join("a.token").display(),
        dir.join("b.token").display()
    );
    let busy = sim.url("http", "/ok");
    let dead = format!("http://127.0.3.2:{dead_port}/x");
    let acked = Arc::new(Mutex::new(Acked::default()));
    let mut dir = Some(dir);
    let mut next = BTreeMap::new();
    let mut starts = Vec::new();
    println!("bench_crashloop: {rounds} lives, seed {seed}");
    for round in 1..=rounds {
        let t = Instant::now();
        let sluice = Sluice::start_in(dir.take().unwrap(), &config);
        let (admin, proxy) = (sluice.admin, sluice.proxy);
        let started = t.elapsed();
        starts.push(started);
        let (_, metrics) = sluice.admin_get("/metrics").await;
        if !metrics.contains("sluice_store_cold_starts_total{reason=\"unreadable\"} 0") {
            eprintln!(
                "life {round}: the store did not open (a cold start)\n{}",
                sluice.log()
            );
            std::process::exit(1);
        }
        if round > 1 {
            let view = acked.lock().unwrap_or_else(|p| p.into_inner()).clone_view();
            match verify(admin, &view).await {
                Ok(stored) => next = stored,
                Err(lost) => {
                    eprintln!("life {round}: LOST after kill -9: {lost}");
                    std::process::exit(1);
                }
            }
        }
        let life = Duration::from_millis(200 + rng.next() % 1300);
        let writers = tokio::spawn(write_hard(
            admin,
            proxy,
            busy.clone(),
            dead.clone(),
            acked.clone(),
            next.clone(),
        ));
        tokio::time::sleep(life).await;
        let store_kib = sluice_tests::harness::walk(&sluice.dir.join("state").join("store"))
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum::<u64>()
            / 1024;
        dir = Some(sluice.kill9());
        let _ = tokio::time::timeout(Duration::from_secs(30), writers).await;
        let a = acked.lock().unwrap_or_else(|p| p.into_inner());
        println!(
            "life {round:>2}: up in {:>4} ms, killed after {:>4} ms; {} commits and {} gaps answered so far; store {store_kib} KiB",
            started.as_millis(),
            life.as_millis(),
            a.commits,
            a.gaps.len()
        );
    }
    // The last life's writes, checked once more.
    let sluice = Sluice::start_in(dir.take().unwrap(), &config);
    let a = acked.lock().unwrap_or_else(|p| p.into_inner()).clone_view();
    if let Err(lost) = verify(sluice.admin, &a).await {
        eprintln!("after the last kill -9: LOST: {lost}");
        std::process::exit(1);
    }
    starts.sort();
    let (_, dead) = sluice.admin_get("/v1/providers/dead").await;
    let dead: Value = serde_json::from_str(&dead).unwrap_or_default();
    let evidence = dead["breaker"]["evidence"].as_array().map_or(0, Vec::len);
    println!(
        "proxied answers by status across the lives: {:?}; the dead provider's breaker evidence kept: {evidence} transitions",
        a.proxied
    );
    println!(
        "bench_crashloop: {rounds} × kill -9 under writes — the store opened every time (0 cold starts); \
         {} checkpoint commits and {} gaps answered as durable, none lost; restart to listening: median {} ms, max {} ms",
        a.commits,
        a.gaps.len(),
        starts[starts.len() / 2].as_millis(),
        starts.last().unwrap().as_millis()
    );
}

impl Acked {
    fn clone_view(&self) -> Acked {
        Acked {
            slices: self.slices.clone(),
            gaps: self.gaps.clone(),
            commits: self.commits,
            proxied: self.proxied.clone(),
        }
    }
}
