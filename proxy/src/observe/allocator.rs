//! What the allocator counts: jemalloc (the binary's allocator, built
//! with its statistics) — allocation requests since start and bytes
//! allocated now. `bench_squid` reads allocations per request from them
//! (issue 38, R-PF1); an operator tells the heap from the resident set
//! (`sluice_allocated_bytes` beside the process's RSS).

use tikv_jemalloc_ctl::{epoch, stats, Access, AsName};

/// Allocation requests served by small size classes and by large ones,
/// every arena merged (`4096` is jemalloc's `MALLCTL_ARENAS_ALL`), each
/// counted whether a thread's cache served it or not.
const SMALL: &[u8] = b"stats.arenas.4096.small.nrequests\0";
const LARGE: &[u8] = b"stats.arenas.4096.large.nrequests\0";
/// Whether this thread's cache is on.
const TCACHE: &[u8] = b"thread.tcache.enabled\0";

/// The allocator's figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocations {
    /// Allocation requests since start.
    pub requests: u64,
    /// Bytes allocated now.
    pub allocated: u64,
}

/// The allocator's figures now; `None` when jemalloc is not the global
/// allocator (the library's own tests) or cannot say.
///
/// A thread's cache serves most requests and tells the arenas of them
/// only as it empties: this thread's cache is emptied first (turned off
/// and on again), so that on one worker (the default) the count is
/// whole. Other workers' caches are told as they empty, every few
/// thousand requests.
pub fn read() -> Option<Allocations> {
    let tcache = TCACHE.name();
    if Access::<bool>::read(tcache).unwrap_or(false) {
        let _ = tcache.write(false);
        let _ = tcache.write(true);
    }
    // The statistics are a snapshot; a new epoch takes another.
    epoch::advance().ok()?;
    let allocated = stats::allocated::read().ok()? as u64;
    let small: u64 = SMALL.name().read().ok()?;
    let large: u64 = LARGE.name().read().ok()?;
    let requests = small + large;
    (requests > 0).then_some(Allocations {
        requests,
        allocated,
    })
}

/// How long pages freed to the allocator stay with it before they go back
/// to the system. jemalloc's default is 10 s: a crawl's hosts let go (R-PF1)
/// or a flood's buffers freed still count in the resident set for most of
/// that — a sidecar's memory limit meets what it held, not what it holds.
/// A second costs a fault per page when a burst comes back soon after.
pub const DECAY_MS: isize = 1000;

/// Makes every arena, and any made later, give freed pages back after
/// [`DECAY_MS`] (jemalloc's `dirty_decay_ms`; its `muzzy_decay_ms` is 0
/// already). Whether jemalloc took it: for arenas to come, and for the
/// first (arenas counted but not made yet refuse it, and need not).
pub fn give_back_sooner() -> bool {
    let arenas = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(0);
    let to_come = b"arenas.dirty_decay_ms\0".name().write(DECAY_MS).is_ok();
    let made: Vec<bool> = (0..arenas)
        .map(|i| {
            let name = format!("arena.{i}.dirty_decay_ms\0");
            name.as_bytes().name().write(DECAY_MS).is_ok()
        })
        .collect();
    to_come && made.first() == Some(&true)
}
