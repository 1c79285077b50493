//! What hosts cost sluice in resident memory (issue 38, R-PF1), the
//! release binary on its defaults but `max_providers`:
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice
//! cargo run --release -p sluice-tests --bin bench_hosts [HOSTS]`
//!
//! 1. one POST to each of `HOSTS` (default 10,000) loopback addresses
//!    where nothing listens (a refused connect, a `502`): the providers'
//!    own state, no upstream connection;
//! 2. one POST to each of as many addresses answered `200` by one origin
//!    on `0.0.0.0` — a broad crawl as a new user meets it: each host
//!    leaves a pooled upstream connection behind, bounded by
//!    `upstream.max_idle_connections` (default);
//! 3. the same with the bound lifted: the difference is what the idle
//!    connections cost, printed per connection.
//!
//! `bench_squid` prints the same after its per-request figures.

#[tokio::main]
async fn main() {
    let hosts: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    sluice_tests::hosts::report(hosts, 1).await;
}
