//! What hosts cost sluice in resident memory (issue 38, R-PF1), the
//! release binary on its defaults but `max_providers`:
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice
//! cargo run --release -p sluice-tests --bin bench_hosts [HOSTS] [CRAWL]`
//!
//! 1. one POST to each of `HOSTS` (default 10,000) loopback addresses
//!    where nothing listens (a refused connect, a `502`): the providers'
//!    own state, no upstream connection; they learn nothing to save;
//! 2. one POST to each of as many addresses refused (`429`) by one origin
//!    on `0.0.0.0`: each learns a cut rate, saved to the store;
//! 3. one POST to each of as many addresses answered `200` by that origin
//!    — a broad crawl as a new user meets it: each host leaves a pooled
//!    upstream connection behind, bounded by
//!    `upstream.max_idle_connections` (default);
//! 4. the same with the bound lifted: the difference is what the idle
//!    connections cost, printed per connection;
//! 5. a broad crawl over `CRAWL` hosts (default 1,000,000; 0 skips it)
//!    with `max_providers = 100000`: resident memory as it goes, the
//!    store, and taught hosts coming back (`sluice_tests::hosts::crawl`).
//!
//! `bench_squid` prints the same after its per-request figures.

#[tokio::main]
async fn main() {
    let arg = |n: usize, default: u32| {
        std::env::args()
            .nth(n)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    sluice_tests::hosts::report(arg(1, 10_000), 1).await;
    sluice_tests::hosts::report_crawl(arg(2, 1_000_000), 5).await;
}
