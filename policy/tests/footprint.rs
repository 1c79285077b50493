//! What one provider's policy state keeps in memory (issue 38, R-PF1: a
//! tracked host costs ≤ 1.5 KB resident, everything included): a broad
//! crawl tracks a hundred thousand of them at once, so every byte of a
//! provider counts a hundred thousand times.
//!
//! Counted by a counting global allocator, on this test's thread only, in
//! the size classes jemalloc (the binary's allocator) rounds each request
//! up to: what the allocator really gives, not what the types ask for. A
//! count, not a timing: it holds on a loaded machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use http::{Request, StatusCode};
use sluice_policy::provider::PolicyOptions;
use sluice_policy::retry::Jitter;
use sluice_policy::stack::provider_stack;
use sluice_policy::{ProviderPolicy, ProviderSettings, ValidSettings};
use tower::ServiceExt;

mod carriers;

use carriers::{Answers, Body};

struct Counting;

thread_local! {
    /// Bytes live, in jemalloc's classes, allocated on this thread.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

/// The size class jemalloc serves `n` bytes from: 8, then steps of 16 up
/// to 128, then four classes to each doubling (160, 192, 224, 256, 320…).
fn class(n: usize) -> i64 {
    let n = n.max(1);
    let size = if n <= 8 {
        8
    } else if n <= 128 {
        n.div_ceil(16) * 16
    } else {
        let group = 1usize << (usize::BITS - 1 - (n - 1).leading_zeros());
        let step = group / 4;
        n.div_ceil(step) * step
    };
    size as i64
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|b| b.set(b.get() + class(layout.size())));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|b| b.set(b.get() - class(layout.size())));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LIVE.try_with(|b| b.set(b.get() - class(layout.size()) + class(new_size)));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn live() -> i64 {
    LIVE.with(Cell::get)
}

/// A host's policy on `settings`, its retries without jitter.
fn host_policy(settings: &Arc<ValidSettings>) -> Arc<ProviderPolicy> {
    ProviderPolicy::new(
        "host.test",
        settings.clone(),
        PolicyOptions {
            jitter: Some(Jitter::Fixed(0.0)),
            ..PolicyOptions::default()
        },
    )
}

/// Bytes a provider's policy keeps once one `POST` (not retried) was
/// answered `status`, the stack that carried it gone: what a broad
/// crawl's host costs while it is tracked. The settings are shared by
/// every provider of the defaults and made before counting.
async fn kept_after_one(settings: &Arc<ValidSettings>, status: StatusCode) -> i64 {
    let before = live();
    let policy = host_policy(settings);
    let mut req = Request::new(Body::default());
    *req.method_mut() = http::Method::POST;
    let resp = provider_stack(&policy, Answers(status))
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(resp.status(), status);
    drop(resp);
    let kept = live() - before;
    drop(policy);
    kept
}

/// Bytes a provider's policy keeps once `n` `GET`s sent together were
/// answered `200`, those past the cold start's first waiting in its room
/// for their slots: what a provider that queued once keeps (the room stays,
/// its waiters' table does not).
async fn kept_after_waiting(settings: &Arc<ValidSettings>, n: usize) -> i64 {
    let before = live();
    let policy = host_policy(settings);
    let stack = provider_stack(&policy, Answers(StatusCode::OK));
    let mut sends = tokio::task::JoinSet::new();
    for _ in 0..n {
        sends.spawn(stack.clone().oneshot(Request::new(Body::default())));
    }
    let started = tokio::time::Instant::now();
    while let Some(resp) = sends.join_next().await {
        assert_eq!(resp.unwrap().unwrap().status(), StatusCode::OK);
    }
    drop(sends);
    assert!(
        started.elapsed() > std::time::Duration::ZERO,
        "some of the {n} waited for their slots"
    );
    drop(stack);
    let kept = live() - before;
    drop(policy);
    kept
}

/// R-PF1, issue 38: a provider's policy, answered once — `200` (it learns
/// nothing), `429` (it learns a cut rate), `502` (a dead host) — in
/// jemalloc's classes. Printed for the benchmarks page; the bounds are
/// today's figures, so that a change that makes every provider bigger
/// fails here, where it is cheap to see, and not in a crawl.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_providers_policy_fits_in_its_bytes() {
    let settings = Arc::new(ProviderSettings::default().validated().unwrap());
    // Warm: the runtime's and the thread's own first allocations.
    kept_after_one(&settings, StatusCode::OK).await;
    let answered = kept_after_one(&settings, StatusCode::OK).await;
    let refused = kept_after_one(&settings, StatusCode::TOO_MANY_REQUESTS).await;
    let failed = kept_after_one(&settings, StatusCode::BAD_GATEWAY).await;
    let waited = kept_after_waiting(&settings, 8).await;
    println!(
        "a provider's policy: answered {answered} B, refused {refused} B, failed {failed} B, \
         queued once {waited} B"
    );
    assert!(answered <= BOUND_ANSWERED, "answered: {answered} B");
    assert!(waited <= BOUND_WAITED, "queued once: {waited} B");
    assert!(refused <= BOUND_REFUSED, "refused: {refused} B");
    assert!(failed <= BOUND_FAILED, "failed: {failed} B");
}

/// Today's figures, 2026-12-06. Earlier: 1,824, 2,320 and 1,968 bytes before the
/// breaker read its settings from the provider's one copy, parking's
/// counters went to 32 bits and the controller's rate changes grew one
/// at a time; 1,712, 2,144 and 1,856 before the retry budget kept its
/// slot length in milliseconds and its reserve in 32 bits (its part of a
/// provider: the 224-byte class, not 256); 1,680, 2,112 and 1,824 before
/// the pacer's part fit the 512-byte class, not 640 (the controller reads
/// its bounds from the shared settings, a fleet's hold and the rate
/// changes are made when first needed, intervals and spans in nanoseconds,
/// the error bands a slice, the latency watch's counts in 32 bits); 1,552,
/// 2,016 and 1,696 before parking fit the 128-byte class, not 160 (its
/// settings read through its neighbours, the parked made by the first to
/// park, its counts in 32 bits); 1,520, 1,984 and 1,664 before the breaker
/// fit the 256-byte class, not 320 (its buckets keep no slot of their
/// own, its failure streak and recent transitions made when first met);
/// 1,456, 1,952 and 1,632 before the pacer's part fit the 448-byte class,
/// not 512 (its rarely used parts behind one pointer, not six; its room
/// and fleet cells one word each; the delivered rate in one word).
/// 2026-12-06: 1,392, 1,888 and 1,568 before the breaker's and the retry
/// budget's windows were kept sparse (16 bytes for a host answered once,
/// not two arrays of 120), the bulkhead kept its semaphore inline, the
/// pacer fit the 384-byte class and the policy's parts went into one
/// allocation (896 bytes, not six summing 1,008). 992, 1,568 and 1,184
/// before the policy fit the 768-byte class, not 896 (parking handed its
/// neighbours and the breaker its holder, not pointed back to; one
/// observer a provider, not three pointers to it; the bulkhead's counts
/// in 32 bits); refused, 1,440 before what probing a known limit keeps
/// was boxed apart from the rest of what pushback teaches (224 bytes, not
/// 384); 1,280 before the last cut was kept with what pushback teaches,
/// not in a box hung from a box of the pacer's rare parts (64 + 48 bytes,
/// for a `Known` in the 256-byte class, not 224). 2026-12-07: refused
/// 1,200, failed 1,056 and queued once 1,088 before instants were kept in
/// one word, not two (`clock::Stamp`: `Known` in the 192-byte class, not
/// 256; a rate change kept in 16 bytes, not 24; the breaker's failure
/// streak in 16, not 32) and the latency baseline's `None` was a NaN (the
/// policy 704 bytes, not 752: still jemalloc's 768 class with its `Arc`).
const BOUND_ANSWERED: i64 = 864;
const BOUND_REFUSED: i64 = 1104;
const BOUND_FAILED: i64 = 1040;
/// Queued once (eight requests sent together): 2026-12-06, 1,600 bytes
/// before the room woke its waiters through a `Notify`, not a `watch`
/// channel (336 bytes), and let its emptied waiters' table go (96) — both
/// kept for the provider's life; 1,088 before instants were kept in one
/// word (2026-12-07).
const BOUND_WAITED: i64 = 1072;
