//! What a tracked provider costs the heap (R-PF1, issue 38): a broad crawl
//! holds up to `max_providers` of them, so their size is its memory.
//! Counted by a counting global allocator in jemalloc's size classes (the
//! binary's allocator rounds each request up to one), on a table past the
//! metric series' label cap, as a crawl's is: a count, not a timing, so it
//! holds on a loaded machine.

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

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        BYTES.fetch_add(class(layout.size()) as i64, Ordering::Relaxed);
        LIVE.fetch_add(1, Ordering::Relaxed);
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

/// Live bytes and allocations now.
fn now() -> (i64, i64) {
    (BYTES.load(Ordering::Relaxed), LIVE.load(Ordering::Relaxed))
}

/// A host's own provider, made by its first request in a crawl's table,
/// costs at most 2,100 bytes of heap in 12 allocations, its share of the
/// table's growth included (3.7 KB in 29 before issue 38's work).
#[tokio::test]
async fn a_tracked_provider_costs_about_two_kilobytes() {
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
