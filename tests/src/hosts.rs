//! What many hosts cost sluice in resident memory (R-PF1, issue 38): for
//! `bench_squid` and `bench_hosts`.

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::harness::{Sluice, TempDir};
use crate::load::one_post_to_each_at;
use crate::procfs::{rss_kib, status_kib};
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
    /// Resident KiB 2 s after the last answer, and providers tracked
    /// then: every host still tracked (they are let go no sooner than
    /// their windows' 10 s), the requests' own buffers given back.
    pub tracked_kib: u64,
    pub tracked_2s: usize,
    /// Resident KiB, heap bytes and providers tracked 6 s after the last
    /// answer: every host still tracked, and the saves every 2 s
    /// (`limits.save_interval`) done with them — the 2 s reading can fall
    /// in the middle of the first, 10,000 records at once.
    pub saved_kib: u64,
    pub heap_saved: f64,
    pub tracked_6s: usize,
    /// Bytes the allocator holds for the heap (`sluice_allocated_bytes`)
    /// before, right after and 15 s after: live state, without the
    /// allocator's slack.
    pub heap_before: f64,
    pub heap_after: f64,
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
    /// Resident KiB once the first half of the hosts were answered (read
    /// from `/proc` alone: a scrape of sluice's metrics would leave its
    /// own garbage in the figure): the second half's cost is what one more
    /// host adds, without what the first requests start once — the pool's
    /// idle connections up to their bound, the metric series up to the
    /// label cap, the store's writer.
    pub half_kib: u64,
    /// Hosts of the second half.
    pub second: u32,
    /// Resident KiB mapped from files (`RssFile`: the binary's own code
    /// and data, paged in as the first requests run it) before and right
    /// after: part of the whole run's figure, none of any one host's.
    pub file_before_kib: u64,
    pub file_after_kib: u64,
}

impl HostsRun {
    /// Bytes per host added, from `before` to `kib`.
    pub fn per_host(&self, kib: u64) -> f64 {
        (kib.saturating_sub(self.before_kib) * 1024) as f64 / self.added.max(1) as f64
    }

    /// Resident bytes per host of the second half.
    pub fn second_half(&self) -> f64 {
        (self.after_kib.saturating_sub(self.half_kib) * 1024) as f64 / f64::from(self.second.max(1))
    }

    /// A line for a bench's output.
    pub fn line(&self) -> String {
        format!(
            "resident {:.1} → {:.1} MiB for {} providers added: {:.0} bytes per host (heap {:.0}; the second half's hosts {:.0} each; \
             the binary's pages {:.1} → {:.1} MiB of it); \
             2 s later {:.1} MiB, {:.0} bytes per host, {} providers tracked; \
             6 s later (saved) {:.1} MiB, {:.0} bytes per host (heap {:.0}), {} tracked; 15 s later {:.1} MiB, {:.0} bytes per host (heap {:.0}); store {:.1} MiB, {:.0} bytes per host; \
             upstream connections open {}, closed for the idle bound {}; {} providers tracked 15 s later",
            self.before_kib as f64 / 1024.0,
            self.after_kib as f64 / 1024.0,
            self.added,
            self.per_host(self.after_kib),
            (self.heap_after - self.heap_before) / self.added.max(1) as f64,
            self.second_half(),
            self.file_before_kib as f64 / 1024.0,
            self.file_after_kib as f64 / 1024.0,
            self.tracked_kib as f64 / 1024.0,
            self.per_host(self.tracked_kib),
            self.tracked_2s,
            self.saved_kib as f64 / 1024.0,
            self.per_host(self.saved_kib),
            (self.heap_saved - self.heap_before) / self.added.max(1) as f64,
            self.tracked_6s,
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

/// One POST to `path` on `port` of each of `n` loopback addresses from
/// `first` on through `sluice`, 16 at a time, each answered `expect`.
pub async fn one_post_each(
    sluice: &Sluice,
    at: (Ipv4Addr, u16, &'static str),
    n: u32,
    expect: u16,
) -> HostsRun {
    let before_kib = rss_kib(sluice.pid());
    let file_before_kib = status_kib(sluice.pid(), "RssFile");
    let heap_before = heap(sluice).await;
    let tracked_before = tracked(sluice).await;
    let (first, port, path) = at;
    let half = n / 2;
    one_post_to_each_at(sluice.proxy, at, half, 16, expect).await;
    let half_kib = rss_kib(sluice.pid());
    let rest = Ipv4Addr::from(u32::from(first) + half);
    one_post_to_each_at(sluice.proxy, (rest, port, path), n - half, 16, expect).await;
    let after_kib = rss_kib(sluice.pid());
    let file_after_kib = status_kib(sluice.pid(), "RssFile");
    let heap_after = heap(sluice).await;
    let added = tracked(sluice).await.saturating_sub(tracked_before);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tracked_kib = rss_kib(sluice.pid());
    let tracked_2s = tracked(sluice).await.saturating_sub(tracked_before);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let saved_kib = rss_kib(sluice.pid());
    let heap_saved = heap(sluice).await;
    let tracked_6s = tracked(sluice).await.saturating_sub(tracked_before);
    tokio::time::sleep(Duration::from_secs(9)).await;
    HostsRun {
        added,
        before_kib,
        after_kib,
        tracked_kib,
        tracked_2s,
        saved_kib,
        heap_saved,
        tracked_6s,
        settled_kib: rss_kib(sluice.pid()),
        heap_before,
        heap_after,
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
        half_kib,
        second: n - half,
        file_before_kib,
        file_after_kib,
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

/// Providers in the table (`sluice_providers_tracked`): the metric, not
/// the admin API's list — a list of 10,000 providers is an answer of
/// several MiB, which would stay in the resident set being measured.
pub async fn tracked(sluice: &Sluice) -> usize {
    sluice
        .metric("sluice_providers_tracked")
        .await
        .unwrap_or(0.0) as usize
}

/// sluice's config for a crawl over `hosts` loopback hosts: loopback
/// allowed, the table sized for them, `extra` appended.
pub fn crawl_config(hosts: u32, extra: &str) -> String {
    format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n[limits]\nmax_providers = {}\n{extra}",
        hosts + 100
    )
}

/// Prints what `hosts` hosts cost, sections numbered from `first` (four
/// of them): refused connects (the providers' own state; nothing learned
/// to save), one origin on `0.0.0.0` refusing each host once with a `429`
/// (each learns a cut rate, saved), the same origin answering `200` on
/// the defaults (idle upstream connections under their bound), and that
/// with the bound lifted — the difference is one idle upstream
/// connection's cost. Uses `127.1/16`–`127.4/16`.
pub async fn report(hosts: u32, first: u32) {
    if hosts == 0 {
        return;
    }
    let origin = Sim::start("0.0.0.0").await;
    let port = origin.addr.port();
    let start = |extra: &str| {
        Sluice::start_as_deployed(TempDir::new("bench-hosts"), &crawl_config(hosts, extra))
    };

    println!("{first}. {hosts} hosts, one POST each, a refused connect (502): providers only");
    let s = start("");
    let refused = one_post_each(&s, ("127.1.0.0".parse().unwrap(), 9, "/ok"), hosts, 502).await;
    println!("  {}\n", refused.line());
    drop(s);

    println!(
        "{}. {hosts} hosts, one POST each refused (429) by one origin on 0.0.0.0:{port}: each learns a cut rate",
        first + 1
    );
    let s = start("");
    let taught = one_post_each(
        &s,
        ("127.4.0.0".parse().unwrap(), port, "/status/429"),
        hosts,
        429,
    )
    .await;
    println!("  {}\n", taught.line());
    drop(s);

    println!(
        "{}. {hosts} hosts, one POST each answered 200 by one origin on 0.0.0.0:{port}, defaults",
        first + 2
    );
    let s = start("");
    let bounded = one_post_each(&s, ("127.2.0.0".parse().unwrap(), port, "/ok"), hosts, 200).await;
    println!("  {}\n", bounded.line());
    drop(s);

    let lifted = hosts + 100;
    println!(
        "{}. the same, upstream.max_idle_connections = {lifted}",
        first + 3
    );
    let s = start(&format!("[upstream]\nmax_idle_connections = {lifted}\n"));
    let unbounded =
        one_post_each(&s, ("127.3.0.0".parse().unwrap(), port, "/ok"), hosts, 200).await;
    println!("  {}", unbounded.line());
    let conns = unbounded.upstream_open - bounded.upstream_open;
    println!(
        "  one idle upstream connection: {:.0} bytes resident ({conns} more open than under the bound; all but the 32 most recent resting)\n",
        (unbounded.settled_kib as f64 - bounded.settled_kib as f64) * 1024.0 / conns.max(1.0),
    );
}

/// A crawl's `provider_idle`: a taught host is evicted (saved, and let go
/// from memory) this long after its request.
pub const CRAWL_IDLE_S: u32 = 30;

/// Every this-many-th host of a crawl is refused once (`429`): it learns
/// something and is saved; the rest are answered `200` and learn nothing.
pub const TAUGHT_EVERY: u32 = 50;

/// What a broad crawl cost: resident memory as it went, and what came
/// back from the store.
#[derive(Debug, Clone)]
pub struct CrawlRun {
    /// Hosts crawled and how long it took.
    pub hosts: u32,
    pub secs: f64,
    /// (hosts done, resident KiB), sampled every second.
    pub samples: Vec<(u32, u64)>,
    /// Resident KiB before the crawl.
    pub before_kib: u64,
    /// Providers tracked when the last host was answered.
    pub tracked_at_end: usize,
    /// Bytes of sled's files at the end.
    pub store_bytes: u64,
    /// Taught hosts of the crawl's first half sampled on their return, and
    /// how many of them resumed their cut rate from the store.
    pub sampled: u32,
    pub restored: u32,
}

impl CrawlRun {
    /// The most resident memory, in MiB.
    pub fn peak_mib(&self) -> f64 {
        let peak = self.samples.iter().map(|s| s.1).max().unwrap_or(0);
        peak as f64 / 1024.0
    }

    /// The lowest and highest resident MiB over the crawl's second half.
    pub fn second_half_mib(&self) -> (f64, f64) {
        let half: Vec<u64> = self
            .samples
            .iter()
            .filter(|s| s.0 >= self.hosts / 2)
            .map(|s| s.1)
            .collect();
        let lo = half.iter().min().copied().unwrap_or(0) as f64 / 1024.0;
        let hi = half.iter().max().copied().unwrap_or(0) as f64 / 1024.0;
        (lo, hi)
    }

    /// Lines for a bench's output.
    pub fn lines(&self) -> String {
        let (lo, hi) = self.second_half_mib();
        let tenths: Vec<String> = (1..=10)
            .filter_map(|k| {
                let at = self.hosts / 10 * k;
                self.samples
                    .iter()
                    .find(|s| s.0 >= at)
                    .map(|s| format!("{:.0}", s.1 as f64 / 1024.0))
            })
            .collect();
        format!(
            "{} hosts in {:.0} s ({:.0} hosts/s): resident {:.1} MiB before, peak {:.1} MiB; \
             second half {lo:.1}–{hi:.1} MiB; at each tenth: {} MiB\n  \
             samples (hosts done, MiB): {}\n  \
             {} providers tracked at the end; store {:.1} MiB ({:.0} bytes per taught host); \
             {} of {} taught hosts sampled on return resumed their rate from the store",
            self.hosts,
            self.secs,
            f64::from(self.hosts) / self.secs.max(1e-9),
            self.before_kib as f64 / 1024.0,
            self.peak_mib(),
            tenths.join(" "),
            self.samples
                .iter()
                .map(|(n, kib)| format!("{n}:{:.0}", *kib as f64 / 1024.0))
                .collect::<Vec<_>>()
                .join(" "),
            self.tracked_at_end,
            self.store_bytes as f64 / f64::from(1 << 20),
            self.store_bytes as f64 / f64::from((self.hosts / TAUGHT_EVERY).max(1)),
            self.restored,
            self.sampled,
        )
    }
}

/// A broad crawl (R-PF1, issue 38): one POST each to `hosts` loopback
/// hosts from `127.16.0.0` on (up to 2^20 of them), against one origin on
/// `0.0.0.0`, over 16 connections, through sluice on its defaults but
/// `max_providers`; every [`TAUGHT_EVERY`]-th host is refused once. Then
/// 20 taught hosts of the first half come back, each looked up in the
/// admin API: restored, and slower than the cold start.
pub async fn crawl(hosts: u32, max_providers: u32) -> CrawlRun {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    assert!(hosts <= 1 << 20, "127.16.0.0/12 holds 2^20 hosts");
    let origin = Sim::start("0.0.0.0").await;
    let port = origin.addr.port();
    let config = format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\n[limits]\nmax_providers = {max_providers}\n\
         provider_idle = \"{CRAWL_IDLE_S}s\"\n"
    );
    let s = Sluice::start_as_deployed(TempDir::new("bench-crawl"), &config);
    let first = u32::from(Ipv4Addr::new(127, 16, 0, 0));
    let before_kib = rss_kib(s.pid());
    let done = Arc::new(AtomicU32::new(0));
    let over = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (done, over, pid) = (done.clone(), over.clone(), s.pid());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !over.load(Ordering::Relaxed) {
                samples.push((done.load(Ordering::Relaxed), rss_kib(pid)));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            samples.push((done.load(Ordering::Relaxed), rss_kib(pid)));
            samples
        })
    };
    let started = tokio::time::Instant::now();
    let conns = 16;
    let per = hosts.div_ceil(conns);
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (proxy, done) = (s.proxy, done.clone());
        tasks.push(tokio::spawn(async move {
            let mut send = crate::load::proxy_sender(proxy).await;
            for i in (c * per)..((c + 1) * per).min(hosts) {
                let ip = Ipv4Addr::from(first + i);
                let (path, expect) = match i % TAUGHT_EVERY {
                    0 => ("/status/429", 429),
                    _ => ("/ok", 200),
                };
                let status =
                    crate::load::post(&mut send, &format!("http://{ip}:{port}{path}")).await;
                assert_eq!(status, expect, "{ip}");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    // The metric, not the admin API's list: the list of 100,000
    // providers is a sizeable answer of its own.
    let tracked_at_end = s.metric("sluice_providers_tracked").await.unwrap_or(0.0) as usize;
    over.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    // Past `provider_idle` and a save: the first half's taught hosts are
    // evicted, saved and let go from memory. Then 20 of them come back.
    tokio::time::sleep(Duration::from_secs(u64::from(CRAWL_IDLE_S) + 5)).await;
    let mut send = crate::load::proxy_sender(s.proxy).await;
    let (mut sampled, mut restored) = (0, 0);
    let step = (hosts / 2 / TAUGHT_EVERY / 20).max(1) * TAUGHT_EVERY;
    for i in (0..hosts / 2).step_by(step as usize).take(20) {
        let ip = Ipv4Addr::from(first + i);
        let status = crate::load::post(&mut send, &format!("http://{ip}:{port}/ok")).await;
        assert_eq!(status, 200, "{ip} on its return");
        let (code, body) = s.admin_get(&format!("/v1/providers/{ip}")).await;
        assert_eq!(code, 200, "{body}");
        let p: serde_json::Value = serde_json::from_str(&body).unwrap();
        sampled += 1;
        if p["restored"] == true && p["rate_rps"].as_f64().is_some_and(|r| r < 5.0) {
            restored += 1;
        }
    }
    CrawlRun {
        hosts,
        secs,
        samples,
        before_kib,
        tracked_at_end,
        store_bytes: bytes_under(&s.dir.join("state").join("store")),
        sampled,
        restored,
    }
}

/// Prints a broad crawl's figures as section `n` (see [`crawl`]); none for
/// `hosts = 0`.
pub async fn report_crawl(hosts: u32, n: u32) {
    if hosts == 0 {
        return;
    }
    const MAX_PROVIDERS: u32 = 100_000;
    println!(
        "{n}. a broad crawl: {hosts} hosts, one POST each (every {TAUGHT_EVERY}th refused once), \
         max_providers = {MAX_PROVIDERS}, provider_idle = {CRAWL_IDLE_S} s"
    );
    let run = crawl(hosts, MAX_PROVIDERS).await;
    println!("  {}\n", run.lines());
}
