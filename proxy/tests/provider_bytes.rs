//! What a tracked provider costs the heap (R-PF1, issue 38): a broad crawl
//! holds up to `max_providers` of them, so their size is its memory.
//! Counted by a counting global allocator in jemalloc's size classes (the
//! binary's allocator rounds each request up to one), on a table past the
//! metric series' label cap, as a crawl's is; and what the first
//! providers' metric series cost (`limits.max_metric_providers` of them
//! hold labels). Counts, not timings: they hold on a loaded machine. The
//! tests take turns (`TURN`): the counts are the whole process's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice::config::Config;
use sluice::observe::metrics::Metrics;
use sluice::observe::Observe;
use sluice::providers::Providers;
use sluice::upstream::guard::Guard;
use sluice::upstream::{tls_config, Upstream};

/// jemalloc's size class for a request of `n` bytes: 8, then steps of 16
/// to 128, then four classes to each doubling.
fn class(n: usize) -> usize {
    if n <= 8 {
        return 8;
    }
    if n <= 128 {
        return n.div_ceil(16) * 16;
    }
    let mut group = 128;
    loop {
        let step = group / 4;
        if n <= group * 2 {
            return n.div_ceil(step) * step;
        }
        group *= 2;
    }
}

struct Counting;

static BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE: AtomicI64 = AtomicI64::new(0);
/// The largest single allocation since it was last reset, in its class.
static LARGEST: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(class(layout.size()) as i64, Ordering::Relaxed);
        LIVE.fetch_add(1, Ordering::Relaxed);
        LARGEST.fetch_max(class(layout.size()) as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        BYTES.fetch_sub(class(layout.size()) as i64, Ordering::Relaxed);
        LIVE.fetch_sub(1, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        BYTES.fetch_add(
            class(new_size) as i64 - class(layout.size()) as i64,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// One test counts at a time.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Live bytes and allocations now.
fn now() -> (i64, i64) {
    (BYTES.load(Ordering::Relaxed), LIVE.load(Ordering::Relaxed))
}

/// A host's own provider, made by its first request in a crawl's table,
/// costs at most 2,100 bytes of heap in 12 allocations, its share of the
/// table's growth included (3.7 KB in 29 before issue 38's work).
#[tokio::test]
async fn a_tracked_provider_costs_about_two_kilobytes() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = Config::from_toml("[limits]\nmax_providers = 100000\n").unwrap();
    let upstream = Upstream::new(
        Guard::default(),
        tls_config(None).unwrap(),
        Duration::from_secs(1),
        256,
    );
    let metrics = Arc::new(Metrics::new(256));
    let observer = Arc::new(Observe::new(metrics, None));
    let table = Providers::new(&config, upstream, Some(observer));
    // Past the label cap, as a crawl's.
    for i in 0..300u32 {
        table.get(&format!("127.15.{}.{}", i / 256, i % 256));
    }
    // A crawl's hosts, IP literals: the table's growth counted with them.
    const N: u32 = 30_000;
    let before = now();
    for i in 0..N {
        table.get(&format!("127.16.{}.{}", i / 256, i % 256));
    }
    let after = now();
    let bytes = (after.0 - before.0) as f64 / f64::from(N);
    let allocations = (after.1 - before.1) as f64 / f64::from(N);
    println!("a provider: {bytes:.0} bytes in {allocations:.1} allocations");
    assert!(bytes <= 2_100.0, "{bytes:.0} bytes a provider");
    assert!(
        allocations <= 12.0,
        "{allocations:.1} allocations a provider"
    );
    assert_eq!(table.all().len(), 30_300);
}

/// R-OP1, R-PF1: a provider with a label of its own — its series made at
/// zero on its first request, and those one answered request feeds (its
/// request, its attempt, the time to the answer's head, its pacing wait) —
/// costs at most 1,000 bytes in 13 allocations. The `prometheus` crate's
/// vectors, which copy the family's description and owned label pairs
/// into each series, cost about 20 KB (measured in `bench_hosts`: 10,000
/// hosts with 256 labels held 0.5 KB a host more than with one); 4.4 KB
/// in 94 allocations before a series kept its label values in one
/// allocation, 3.5 KB in 47 before the series at zero were written at
/// each scrape rather than kept.
#[test]
fn a_labelled_providers_series_cost_under_a_kilobyte() {
    use sluice_policy::classify::Outcome;
    use sluice_policy::events::Event;
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    const N: u32 = 200;
    let metrics = Metrics::new(N as usize + 10);
    // The families' maps past their first growths.
    for i in 0..10 {
        metrics.init_provider(&metrics.label(&format!("127.17.0.{i}")));
    }
    let names: Vec<String> = (0..N)
        .map(|i| format!("127.18.{}.{}", i / 256, i % 256))
        .collect();
    let before = now();
    for name in &names {
        let label = metrics.label(name);
        metrics.init_provider(&label);
        metrics.request(&label, "success");
        let attempt = Event::Attempt {
            outcome: Some(Outcome::Success),
            ttfb: Some(Duration::from_millis(3)),
        };
        metrics.event(&label, &attempt);
        metrics.event(&label, &Event::PacingWait(Duration::from_millis(1)));
    }
    let after = now();
    let bytes = (after.0 - before.0) as f64 / f64::from(N);
    let allocations = (after.1 - before.1) as f64 / f64::from(N);
    println!("a labelled provider's series: {bytes:.0} bytes in {allocations:.1} allocations");
    assert!(bytes <= 1_000.0, "{bytes:.0} bytes a labelled provider");
    assert!(allocations <= 13.0, "{allocations:.1} allocations");
    let text = metrics.render();
    for name in &names {
        assert!(
            text.contains(&format!(
                "sluice_requests_total{{outcome=\"success\",provider=\"{name}\"}} 1"
            )),
            "{name}'s request is exported"
        );
        assert!(
            text.contains(&format!("sluice_breaker_transitions_total{{from=\"half_open\",provider=\"{name}\",reason=\"probe_failed\",to=\"open\"}} 0")),
            "{name}'s zeroes are exported"
        );
    }
}

/// R-PF1, issue 38 (nothing but policy above the floor): the future of one
/// upstream attempt — boxed once per request — holds what a request on a
/// ready pooled connection needs, not a new connection's handshake, TLS
/// or an upgrade's client: those are boxed apart when they happen. The
/// largest allocation the call makes (never polled) is that box: 1,944
/// bytes (the 2,048-byte class), against 7,976 (8,192) when the handshake
/// lived inline and every request carried and copied it.
#[tokio::test]
async fn an_attempts_future_leaves_the_handshake_out() {
    use sluice::http::body::ProxyBody;
    use tower::Service;
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut upstream = Upstream::new(
        Guard::default(),
        tls_config(None).unwrap(),
        Duration::from_secs(1),
        256,
    );
    let req = http::Request::builder()
        .uri("http://127.0.0.1:9/ok")
        .body(ProxyBody::empty())
        .unwrap();
    LARGEST.store(0, Ordering::Relaxed);
    let future = upstream.call(req);
    let largest = LARGEST.load(Ordering::Relaxed);
    drop(future);
    println!("an attempt's future: its box {largest} bytes");
    assert!(largest <= 2_048, "{largest} bytes");
}
