//! sluice's control algorithms and the tower layers that apply them.
//!
//! Everything a provider's budget depends on is decided here, and nothing
//! here does I/O: no sockets, no files, no hyper. Each algorithm is a plain
//! state machine whose methods take the current time (`now`) as an argument,
//! so the same code is driven by the real clock in the proxy and by tokio's
//! paused clock (or a hand-advanced `Instant`) in tests. The tower layers are
//! thin: they read the clock ([`clock::now`]: once in each poll of a
//! request), call the state machine, and wait.
//!
//! One provider's stack, outermost first (see [`stack`]):
//!
//! ```text
//! request timeout (the whole request, up to its response head)
//!   → retry (ratio budget, full jitter, Retry-After)
//!   → parking (an outage's requests wait for its end; only probes go)
//!   → run envelope (request cap, deadline: checked before each attempt)
//!   → circuit breaker (sliding window, minimum throughput, half-open probes)
//!   → pacer (GCRA pacing at a rate learned by AIMD, Retry-After hold, FIFO queue)
//!   → bulkhead (attempts in flight, bounded queue)
//!   → per-attempt timeout
//!   → upstream
//! ```
//!
//! No layer imports another: what a request is travels in one
//! [`attempt::Attempt`] in its extensions, what its attempt learned in one
//! [`attempt::Report`] on its response; what one layer reads of another's
//! state (the breaker's of the retry budget, parking's of the breaker and
//! the rate controller) is composed in [`provider`]. What an answer means
//! is decided once, in [`classify`].
//!
//! Defaults, each with the public reference it comes from, live in one place:
//! [`settings`].
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod attempt;
pub mod breaker;
pub mod bulkhead;
pub mod classify;
pub mod clock;
pub mod cost;
pub mod error;
pub mod events;
pub mod future;
pub mod pacer;
pub mod park;
pub mod provider;
pub mod quota;
pub mod retry;
pub mod run;
pub mod settings;
pub mod stack;
pub mod timeout;
mod window;

pub use classify::Outcome;
pub use error::BoxError;
pub use provider::ProviderPolicy;
pub use settings::{ProviderSettings, ValidSettings};
