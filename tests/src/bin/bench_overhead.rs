//! What passing through sluice costs, against the same origin without it,
//! in one run.
//!
//! `cargo run --release -p sluice-tests --bin bench_overhead`
//! (build the proxy first: `cargo build --release -p sluice`)
//!
//! A fast origin (the provider simulator's `/ok`) on loopback; `CONNS`
//! keep-alive HTTP/1.1 connections send requests back to back for
//! `SECS` seconds, first straight to the origin, then through the real
//! `sluice` binary (its pacer's start rate and ceiling set far above what
//! the machine can do, so only the proxy's own work is measured).
//! Printed: requests per second and latency percentiles, and the ratios.

use sluice_tests::harness::Sluice;
use sluice_tests::load::{load, Run};
use sluice_tests::procfs::{cpu_seconds, status_kib};
use sluice_tests::sim::Sim;

const CONNS: usize = 32;
const SECS: u64 = 5;

#[tokio::main]
async fn main() {
    let sim = Sim::start("127.0.0.60").await;
    let sluice = Sluice::start_as_deployed(
        sluice_tests::harness::TempDir::new("bench-overhead"),
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
         [defaults]\nceiling_rps = 1000000.0\nstart_rps = 999999.0\nburst = 1000\n\
         max_in_flight = 10000\nmax_queue_len = 10000\n",
    );
    let direct = load(sim.addr, "/ok".to_string(), CONNS, SECS).await;
    let idle_rss = status_kib(sluice.pid(), "VmRSS");
    let cpu_before = cpu_seconds(sluice.pid());
    let proxied = load(sluice.proxy, sim.url("http", "/ok"), CONNS, SECS).await;
    let cpu = cpu_seconds(sluice.pid()) - cpu_before;
    let peak_rss = status_kib(sluice.pid(), "VmHWM");
    let row = |name: &str, r: &Run| {
        println!(
            "{name:<14} {:>9.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms",
            r.rps,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3
        )
    };
    println!("{CONNS} keep-alive connections, {SECS} s each, loopback, one machine");
    row("direct", &direct);
    row("through sluice", &proxied);
    println!(
        "through sluice: {:.2}× the direct throughput, p50 +{:.3} ms, p99 +{:.3} ms",
        proxied.rps / direct.rps,
        (proxied.p50.as_secs_f64() - direct.p50.as_secs_f64()) * 1e3,
        (proxied.p99.as_secs_f64() - direct.p99.as_secs_f64()) * 1e3
    );
    // The figures the Kubernetes sidecar's requests and limits come from.
    println!(
        "sluice process: RSS idle {:.1} MiB, peak under this load {:.1} MiB; CPU {:.2} cores at {:.0} req/s ({:.1} µs per request)",
        idle_rss as f64 / 1024.0,
        peak_rss as f64 / 1024.0,
        cpu / SECS as f64,
        proxied.rps,
        cpu / (proxied.rps * SECS as f64) * 1e6
    );
}
