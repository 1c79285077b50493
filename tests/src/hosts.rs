//! What many hosts cost sluice in resident memory (R-PF1, issue 38): for
//! `bench_squid` and `bench_hosts`.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::harness::{Sluice, TempDir};
use crate::load::one_post_to_each;
use crate::procfs::rss_kib;
use crate::sim::Sim;

/// One pass of one request to each of many hosts.
#[derive(Debug, Clone, Copy)]
pub struct HostsRun {
    /// Providers the table gained.
    pub added: usize,
    /// Resident KiB before, right after the last answer, and 15 s later
    /// (saves stored, idle work given back).
    pub before_kib: u64,
    pub after_kib: u64,
    pub settled_kib: u64,
    /// Bytes the allocator holds for the heap (`sluice_allocated_bytes`)
    /// before and 15 s after: live state, without the allocator's slack.
    pub heap_before: f64,
    pub heap_settled: f64,
    /// Bytes of sled's files (`state/store`) 15 s later, every provider
    /// saved.
    pub store_bytes: u64,
    /// Pooled upstream connections open 15 s after, and closed for the
    /// idle bound (`/metrics`).
    pub upstream_open: f64,
    pub idle_closed: f64,
    /// Providers still tracked 15 s later (those that learned nothing are
    /// let go once their windows pass).
    pub tracked_settled: usize,
}

impl HostsRun {
    /// Bytes per host added, from `before` to `kib`.
    pub fn per_host(&self, kib: u64) -> f64 {
        (kib.saturating_sub(self.before_kib) * 1024) as f64 / self.added.max(1) as f64
    }

    /// A line for a bench's output.
    pub fn line(&self) -> String {
        format!(
            "resident {:.1} → {:.1} MiB for {} providers added: {:.0} bytes per host; \
             15 s later {:.1} MiB, {:.0} bytes per host (heap {:.0}); store {:.1} MiB, {:.0} bytes per host; \
             upstream connections open {}, closed for the idle bound {}; {} providers tracked 15 s later",
            self.before_kib as f64 / 1024.0,
            self.after_kib as f64 / 1024.0,
            self.added,
            self.per_host(self.after_kib),
            self.settled_kib as f64 / 1024.0,
            self.per_host(self.settled_kib),
            (self.heap_settled - self.heap_before) / self.added.max(1) as f64,
            self.store_bytes as f64 / f64::from(1 << 20),
            self.store_bytes as f64 / self.added.max(1) as f64,
            self.upstream_open,
            self.idle_closed,
            self.tracked_settled,
        )
    }
}

/// One POST to `/ok` on `port` of each of `n` loopback addresses from
/// `first` on through `sluice`, 16 at a time, each answered `expect`.
pub async fn one_post_each(
    sluice: &Sluice,
    first: Ipv4Addr,
    port: u16,
    n: u32,
    expect: u16,
) -> HostsRun {
    let before_kib = rss_kib(sluice.pid());
    let heap_before = heap(sluice).await;
    let tracked_before = tracked(sluice).await;
    one_post_to_each(sluice.proxy, first, port, n, 16, expect).await;
    let after_kib = rss_kib(sluice.pid());
    let added = tracked(sluice).await.saturating_sub(tracked_before);
    tokio::time::sleep(Duration::from_secs(15)).await;
    HostsRun {
        added,
        before_kib,
        after_kib,
        settled_kib: rss_kib(sluice.pid()),
        heap_before,
        heap_settled: heap(sluice).await,
        tracked_settled: tracked(sluice).await,
        store_bytes: bytes_under(&sluice.dir.join("state").join("store")),
        upstream_open: sluice
            .metric("sluice_upstream_connections")
            .await
            .unwrap_or(0.0),
        idle_closed: sluice
            .metric("sluice_upstream_idle_closed_total")
            .await
            .unwrap_or(0.0),
    }
}

/// Bytes the allocator holds now.
async fn heap(sluice: &Sluice) -> f64 {
    sluice.metric("sluice_allocated_bytes").await.unwrap_or(0.0)
}

/// Bytes of the files under `dir`, however deep.
fn bytes_under(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => bytes_under(&e.path()),
                _ => e.metadata().map_or(0, |m| m.len()),
            })
            .sum()
    })
}

/// Providers the admin API lists.
pub async fn tracked(sluice: &Sluice) -> usize {
    let (status, body) = sluice.admin_get("/v1/providers").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v.as_array()
        .or_else(|| v["providers"].as_array())
        .map_or(0, |a| a.len())
}

/// sluice's config for a crawl over `hosts` loopback hosts: loopback
/// allowed, the table sized for them, `extra` appended.
pub fn crawl_config(hosts: u32, extra: &str) -> String {
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n[limits]\nmax_providers = {}\n{extra}",
        hosts + 100
    )
}

/// Prints what `hosts` hosts cost, sections numbered from `first`:
/// refused connects (the providers' own state), one origin on `0.0.0.0`
/// answering `200` on the defaults (idle upstream connections under
/// their bound), and the same with the bound lifted — the difference is
/// one idle upstream connection's cost. Uses `127.1/16`–`127.3/16`.
pub async fn report(hosts: u32, first: u32) {
    let origin = Sim::start("0.0.0.0").await;
    let port = origin.addr.port();
    let start = |extra: &str| {
        Sluice::start_as_deployed(TempDir::new("bench-hosts"), &crawl_config(hosts, extra))
    };

    println!("{first}. {hosts} hosts, one POST each, a refused connect (502): providers only");
    let s = start("");
    let refused = one_post_each(&s, "127.1.0.0".parse().unwrap(), 9, hosts, 502).await;
    println!("  {}\n", refused.line());
    drop(s);

    println!(
        "{}. {hosts} hosts, one POST each answered 200 by one origin on 0.0.0.0:{port}, defaults",
        first + 1
    );
    let s = start("");
    let bounded = one_post_each(&s, "127.2.0.0".parse().unwrap(), port, hosts, 200).await;
    println!("  {}\n", bounded.line());
    drop(s);

    let lifted = hosts + 100;
    println!(
        "{}. the same, upstream.max_idle_connections = {lifted}",
        first + 2
    );
    let s = start(&format!("[upstream]\nmax_idle_connections = {lifted}\n"));
    let unbounded = one_post_each(&s, "127.3.0.0".parse().unwrap(), port, hosts, 200).await;
    println!("  {}", unbounded.line());
    let conns = unbounded.upstream_open - bounded.upstream_open;
    println!(
        "  one idle upstream connection: {:.0} bytes resident ({conns} more open than under the bound)\n",
        (unbounded.settled_kib as f64 - bounded.settled_kib as f64) * 1024.0 / conns.max(1.0),
    );
}
