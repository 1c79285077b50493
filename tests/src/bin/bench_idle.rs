//! What an idle client connection costs sluice in resident memory.
//!
//! `cargo build --release -p sluice && SLUICE_BIN=target/release/sluice \
//!  cargo run --release -p sluice-tests --bin bench_idle`
//!
//! Starts the real binary, reads its resident set (`VmRSS` in
//! `/proc/<pid>/status`), opens `CONNS` TCP connections to the proxy
//! listener that send nothing (collectors holding keep-alive connections
//! open between requests look the same), waits for sluice to have accepted
//! them, reads the resident set again and prints the difference per
//! connection. Twice, to show the figure is stable; the second round after
//! closing the first's connections.

use std::time::Duration;

use sluice_tests::harness::Sluice;
use sluice_tests::procfs::{open_fds, rss_kib};
use tokio::net::TcpStream;

const CONNS: usize = 2000;

#[tokio::main]
async fn main() {
    let sluice = Sluice::start("[limits]\nheader_read_timeout = \"300s\"\n");
    let pid = sluice.pid();
    // Let it settle (runtime threads, first allocations).
    tokio::time::sleep(Duration::from_millis(500)).await;
    for round in 1..=2 {
        let before = rss_kib(pid);
        let mut conns = Vec::with_capacity(CONNS);
        for _ in 0..CONNS {
            conns.push(TcpStream::connect(sluice.proxy).await.expect("connect"));
        }
        // Accepting is asynchronous: give sluice a moment to take them all.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = rss_kib(pid);
        let fds = open_fds(pid);
        let per = (after.saturating_sub(before)) as f64 * 1024.0 / CONNS as f64;
        println!(
            "round {round}: {CONNS} idle connections ({fds} descriptors open in sluice): \
             RSS {before} KiB → {after} KiB, {:.0} bytes ({:.1} KiB) each",
            per,
            per / 1024.0
        );
        drop(conns);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
