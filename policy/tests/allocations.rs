//! What a request costs the allocator on its way through a provider's
//! stack when nothing is amiss (issue 38, R-PF1): the stack's one boxed
//! future and the request's clock. Every layer decides in `call` and
//! returns its fast path unboxed; the request's attempt rides in its body
//! and the answer's report and permit in the answer's (`CarriesAttempt`,
//! `CarriesReport`), as the proxy's bodies carry them.
//!
//! Counted by a counting global allocator, on this test's thread only:
//! a count, not a timing, so it holds on a loaded machine.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use http::{Request, StatusCode};
use sluice_policy::attempt::Report;
use sluice_policy::provider::PolicyOptions;
use sluice_policy::retry::Jitter;
use sluice_policy::stack::provider_stack;
use sluice_policy::{ProviderPolicy, ProviderSettings};
use tower::ServiceExt;

mod carriers;

use carriers::{Answers, Body};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_with_nothing_amiss_allocates_twice_through_the_whole_stack() {
    // Pacing far above what the test sends: every slot is free at once.
    let settings = ProviderSettings {
        start_rps: Some(999_999.0),
        ceiling_rps: 1_000_000.0,
        burst: 1_000,
        ..ProviderSettings::default()
    };
    let policy = ProviderPolicy::new(
        "provider.test",
        settings.validated().unwrap(),
        PolicyOptions {
            jitter: Some(Jitter::Fixed(0.0)),
            ..PolicyOptions::default()
        },
    );
    let stack = provider_stack(&policy, Answers(StatusCode::OK));
    let request = || Request::new(Body::default());
    // Warm: the provider's first answers grow what it keeps (its windows).
    for _ in 0..100 {
        let resp = stack.clone().oneshot(request()).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let (sent, before) = (200u64, allocations());
    for _ in 0..sent {
        let resp = stack.clone().oneshot(request()).await.unwrap();
        // The answer was stamped and holds its permit: the layers ran.
        assert!(Report::of(&resp).is_some());
    }
    let per_request = (allocations() - before) as f64 / sent as f64;
    // The stack's boxed future and the request's clock; was 24 with a
    // box per layer and the attempt and report in extensions.
    assert!(
        per_request <= 2.0,
        "{per_request} allocations per request through the stack"
    );
    assert_eq!(policy.bulkhead.in_flight(), 0, "every permit came back");
}
