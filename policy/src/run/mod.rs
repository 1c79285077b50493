//! A run's envelope: request cap, deadline and retry budget (R-RN1–R-RN3).
//!
//! A collector's run may carry budgets — "at most 10 000 requests", "stop
//! by 06:00", "at most 200 retries". Running out of one is a *planned*
//! stop: the collector hands the rest to its next run. It must never look
//! like provider pressure, or a scheduler would back off a healthy provider
//! and the learned rate would shrink for no reason. So:
//!
//! * stop reasons come in two disjoint sets, budget and source pressure
//!   ([`StopReason::is_source_pressure`]);
//! * the envelope is checked *before* an attempt starts, never during one:
//!   an attempt in flight completes (R-RN2);
//! * the check sits outside the breaker and pacer in the stack, so a budget
//!   refusal never touches their state (R-RN3);
//! * source pressure is waited out per cool-down cycle and per provider
//!   (R-RN8): every request of the run that waits out the same open
//!   period or hold counts as one wait, and a provider that keeps
//!   re-opening stops only its own part of the run.
//!
//! With nothing configured, the envelope is unbounded and behaviour is
//! unchanged. The budgets are [`Envelope`]; the counters against them
//! [`RunState`] (`state.rs`); the handle a run's requests share, with its
//! durable reservation, [`RunHandle`] (`handle.rs`); the tower layer that
//! checks them before each attempt [`RunGate`] (`layer.rs`).
//!
//! A run travels with each request as a [`RunHandle`] in its
//! [`Attempt`](crate::attempt::Attempt). The deadline is the gate's: the
//! pacer below only refuses a slot at or past the instant the request may
//! not wait past, and the gate turns that into the run's stop.

mod error;
mod handle;
mod layer;
mod state;

pub use self::error::RunStopped;
pub use self::handle::{reservation_block, Reserve, RunHandle};
pub use self::layer::{RunGate, RunLayer, RunSignals};
pub use self::state::{Cooldown, Cycle, ProviderWaits, RunState};

use tokio::time::Instant;

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// Budget: the request cap was reached.
    RequestCap,
    /// Budget: the wall-clock deadline passed.
    Deadline,
    /// Budget: the run's retry budget is spent.
    RetryBudget,
    /// Source pressure: the provider throttled.
    Throttled,
    /// Source pressure: the provider's circuit is open.
    CircuitOpen,
    /// Source pressure: the provider asked for a wait too long to absorb.
    RetryAfter,
    /// Source pressure: the provider failed.
    UpstreamError,
}

impl StopReason {
    /// Every reason, budget ones first.
    pub const ALL: [StopReason; 7] = [
        StopReason::RequestCap,
        StopReason::Deadline,
        StopReason::RetryBudget,
        StopReason::Throttled,
        StopReason::CircuitOpen,
        StopReason::RetryAfter,
        StopReason::UpstreamError,
    ];

    /// Whether the provider caused it (as opposed to a planned budget).
    pub fn is_source_pressure(self) -> bool {
        !self.is_budget()
    }

    /// Whether a budget ran out: a planned stop.
    pub fn is_budget(self) -> bool {
        matches!(
            self,
            StopReason::RequestCap | StopReason::Deadline | StopReason::RetryBudget
        )
    }

    /// The label used in `Proxy-Status` details, metrics and the store.
    pub fn label(self) -> &'static str {
        match self {
            StopReason::RequestCap => "request_cap",
            StopReason::Deadline => "deadline",
            StopReason::RetryBudget => "retry_budget",
            StopReason::Throttled => "throttled",
            StopReason::CircuitOpen => "circuit_open",
            StopReason::RetryAfter => "retry_after",
            StopReason::UpstreamError => "upstream_error",
        }
    }
}

/// The budgets of a run; `None` means unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Envelope {
    /// Attempts allowed, retries included.
    pub request_cap: Option<u64>,
    /// No attempt starts at or after this instant.
    pub deadline: Option<Instant>,
    /// Retries allowed in the run.
    pub retry_budget: Option<u64>,
    /// Retries allowed as a share of the run's first attempts (at least
    /// one retry once there is a first attempt).
    pub retry_ratio: Option<f64>,
    /// Cool-down cycles of one provider (`breaker_open_for` of an outage,
    /// a long `Retry-After` hold) the run may wait out in a row before that
    /// provider's part of it stops with a source-pressure reason (R-RN8).
    /// 0: no waiting.
    pub max_cooldown_waits: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_sets_are_disjoint_and_cover_all() {
        for r in StopReason::ALL {
            assert_ne!(r.is_budget(), r.is_source_pressure(), "{r:?}");
        }
        let budget: Vec<_> = StopReason::ALL.iter().filter(|r| r.is_budget()).collect();
        assert_eq!(budget.len(), 3);
    }
}
