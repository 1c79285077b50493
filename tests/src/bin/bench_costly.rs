//! Costly requests are not a throttle (issue 21, R-SG3): a provider that
//! takes far more than the ceiling (no limit below 1,000 req/s) where a
//! share of requests is 300–400 ms slower, against the same clients on a
//! clean provider, at ceilings of 100, 200 and 500 req/s.
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice
//! cargo run --release -p sluice-tests --bin bench_costly [SECS]`
//!
//! Per ceiling, one real `sluice` (`[defaults] ceiling_rps`) and three
//! providers, run one after another for SECS (default 30): clean, 10 % of
//! requests heavier, 30 % heavier. Naive Python `requests` threads
//! configured by `HTTP_PROXY` only, enough of them that the clients are
//! not what limits the heavy runs (a quarter of the ceiling: at 500 req/s
//! with 30 % of requests ~350 ms heavier, ~55 are in flight at the
//! provider). Printed: successes per second at the provider over the
//! second half and over the whole run, and each heavy run's ratio to the
//! clean run at the same ceiling (the issue asks ≥ 0.8), and sluice's
//! learned rate and last cut for each provider. `CEILINGS=200,500` runs
//! some of them.
//!
//! Measured (2 cores): 1.00 and 1.00 of clean at 100 and at 200 req/s
//! (each run at its ceiling over 15–30 s); at 500 the clean run is held by
//! the machine near 325 /s (the clients that sluice's queue bound refuses
//! retry at once and spin) and the heavy runs get 1.03–1.24 of it. No run
//! at any ceiling was cut.

use sluice_tests::clients::naive_clients;
use sluice_tests::harness::Sluice;
use sluice_tests::sim::Sim;

#[tokio::main]
async fn main() {
    let secs: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let half = u64::from(secs / 2);
    let mut ratios = Vec::new();
    for (i, ceiling) in ceilings() {
        let sluice = Sluice::start(&format!(
            "[destinations]\nallow = [\"127.0.0.0/8\"]\n[defaults]\nceiling_rps = {ceiling}.0\n"
        ));
        let clients = (ceiling / 4).max(16);
        let mut clean = None;
        for (j, (name, path)) in [
            ("clean", "/ok"),
            ("10 % +300–400 ms", "/heavy/10/300-400"),
            ("30 % +300–400 ms", "/heavy/30/300-400"),
        ]
        .into_iter()
        .enumerate()
        {
            let sim = Sim::start(&format!("127.0.4.{}", 10 * i + j + 1)).await;
            // Python's lock caps one process near 300 req/s here: the
            // threads are spread over processes of at most 40.
            let (proxy, url) = (sluice.proxy_url(), sim.url("http", path));
            let procs = clients.div_ceil(40);
            let runs = (0..procs).map(|_| {
                let (proxy, url) = (proxy.clone(), url.clone());
                async move { naive_clients(&proxy, &url, clients / procs, secs, &[]).await }
            });
            let seen = futures_join(runs).await.join(" | ");
            let limit = f64::from(ceiling);
            let (second, whole) = (
                sim.figures(path, half, 2 * half, limit),
                sim.figures(path, 0, u64::from(secs), limit),
            );
            let per_s = second.accepted as f64 / half as f64;
            let ratio = match clean {
                None => {
                    clean = Some(per_s);
                    1.0
                }
                Some(c) => per_s / c,
            };
            if name != "clean" {
                ratios.push((ceiling, name, ratio));
            }
            let (_, v) = sluice
                .api(
                    "GET",
                    &format!("/v1/providers/127.0.4.{}", 10 * i + j + 1),
                    None,
                )
                .await;
            println!(
                "  sluice's view: rate {:.0} req/s, last cut {}",
                v["rate_rps"].as_f64().unwrap_or(0.0),
                v["last_backoff"]
            );
            println!(
                "ceiling {ceiling:>3} req/s, {clients:>3} clients, {name:<17}: {:>6.1} /s over \
                 {half}–{} s ({ratio:.2} of clean), {:>6.1} /s over the whole run; clients saw {}",
                per_s,
                2 * half,
                whole.accepted as f64 / f64::from(secs),
                seen.trim()
            );
        }
    }
    let worst = ratios
        .iter()
        .map(|(_, _, r)| *r)
        .fold(f64::INFINITY, f64::min);
    println!("worst heavy/clean ratio: {worst:.2}");
}

/// The ceilings: `CEILINGS=500` (comma-separated) for some; else all.
fn ceilings() -> impl Iterator<Item = (usize, u32)> {
    let all = std::env::var("CEILINGS").unwrap_or_else(|_| "100,200,500".into());
    let list: Vec<u32> = all
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    [100u32, 200, 500]
        .into_iter()
        .enumerate()
        .filter(move |(_, c)| list.contains(c))
}

/// Runs the futures at once; their outputs in order.
async fn futures_join<F: std::future::Future<Output = String> + Send + 'static>(
    runs: impl Iterator<Item = F>,
) -> Vec<String> {
    let tasks: Vec<_> = runs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a client process").trim().to_string());
    }
    out
}
