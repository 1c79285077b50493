//! What a shared admission costs (issue 13, R-DS1): the same provider
//! through the real `sluice` binary, its budget local and then shared
//! through a real `redis-server`, side by side in one run.
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice
//! cargo run --release -p sluice-tests --bin bench_shared`
//!
//! A fast origin (the simulator's `/ok`) on loopback; `CONNS` keep-alive
//! connections send requests back to back for `SECS` seconds through a
//! sluice whose pacing is set far above what the machine can do (so only
//! the admission's own work is measured), first with the provider's
//! budget local, then shared. Printed: requests per second, latency
//! percentiles, the difference at the median, and Redis round trips per
//! request (the server's own count of script calls).

use sluice_tests::harness::Sluice;
use sluice_tests::load::{load, Run};
use sluice_tests::redis::Redis;
use sluice_tests::sim::Sim;

const CONNS: usize = 4;
const SECS: u64 = 5;

/// Script calls the Redis server has run so far.
fn script_calls(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

#[tokio::main]
async fn main() {
    let redis = Redis::start();
    let sim = Sim::start("127.0.0.61").await;
    let config = |shared: bool| {
        format!(
            "[destinations]\nallow = [\"127.0.0.0/8\"]\n\
             [shared]\nredis = \"{}\"\n\
             [providers.p]\nhosts = [\"127.0.0.61\"]\nshared = {shared}\n\
             ceiling_rps = 1000000.0\nstart_rps = 999999.0\nburst = 1000\n\
             max_in_flight = 10000\nmax_queue_len = 10000\n",
            redis.url()
        )
    };
    let uri = sim.url("http", "/ok");
    let local = Sluice::start(&config(false));
    let alone = load(local.proxy, uri.clone(), CONNS, SECS).await;
    drop(local);
    let shared = Sluice::start(&config(true));
    let before = script_calls(&redis);
    let together = load(shared.proxy, uri, CONNS, SECS).await;
    let calls = script_calls(&redis) - before;
    let row = |name: &str, r: &Run| {
        println!(
            "{name:<16} {:>8.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms",
            r.rps,
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3
        )
    };
    println!("{CONNS} keep-alive connections, {SECS} s each, loopback, one machine, pacing far above the load");
    row("budget local", &alone);
    row("budget shared", &together);
    println!(
        "shared: {:.2}× the local throughput, p50 +{:.3} ms, p99 +{:.3} ms; {:.2} Redis round trips per request ({calls} script calls for {} requests)",
        together.rps / alone.rps,
        (together.p50.as_secs_f64() - alone.p50.as_secs_f64()) * 1e3,
        (together.p99.as_secs_f64() - alone.p99.as_secs_f64()) * 1e3,
        calls as f64 / together.requests as f64,
        together.requests
    );
}
