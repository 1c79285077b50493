//! What the store keeps per provider: the learned state and the breaker
//! evidence, as they are written (JSON; provider names, numbers and fixed
//! labels only, R-SF4).

use super::*;

/// A breaker state as stored: the same words as the metrics and the
/// readout (`closed`, `open`, `half_open`). A word this version does not
/// know reads as closed — the breaker then judges the provider afresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredBreaker {
    /// Calls flow.
    Closed,
    /// Failing fast until the reset timeout.
    Open,
    /// Probing.
    HalfOpen,
    /// A word this version does not know (never written).
    #[serde(other)]
    Unknown,
}

impl From<State> for StoredBreaker {
    fn from(s: State) -> Self {
        match s {
            State::Closed => StoredBreaker::Closed,
            State::Open => StoredBreaker::Open,
            State::HalfOpen => StoredBreaker::HalfOpen,
        }
    }
}

impl From<StoredBreaker> for State {
    fn from(s: StoredBreaker) -> Self {
        match s {
            StoredBreaker::Closed | StoredBreaker::Unknown => State::Closed,
            StoredBreaker::Open => State::Open,
            StoredBreaker::HalfOpen => State::HalfOpen,
        }
    }
}

/// A provider's learned state as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedRecord {
    /// Format version.
    pub v: u32,
    /// When it was last true — the provider's last use (wall clock, ms
    /// since the epoch).
    pub saved_at_unix_ms: u64,
    /// The learned rate.
    pub rate_rps: f64,
    /// Where throttling began.
    pub limit_rps: Option<f64>,
    /// TTFB baseline, ms.
    pub baseline_ms: Option<f64>,
    /// The breaker's state.
    pub breaker: StoredBreaker,
    /// Time left open, ms.
    pub open_remaining_ms: Option<u64>,
    /// When the allowance's current period began (wall clock, ms since the
    /// epoch), if one is set and begun.
    #[serde(default)]
    pub allowance_began_unix_ms: Option<u64>,
    /// Units spent in that period.
    #[serde(default)]
    pub allowance_spent: Option<f64>,
    /// The provider's hold after its last refusal (`Retry-After`), ms, if
    /// it holds.
    #[serde(default)]
    pub hold_ms: Option<u64>,
    /// The limit is a token bucket's refill rate, fitted or found by a
    /// dwell.
    #[serde(default)]
    pub limit_fitted: bool,
    /// The limit's refusals went on through a cut's echo.
    #[serde(default)]
    pub limit_sharp: bool,
    /// The limit was told by bare 503s and met twice at one place.
    #[serde(default)]
    pub limit_steady: bool,
    /// A print of the provider's config when it was learned: an open
    /// breaker restored under another config is cleared.
    #[serde(default)]
    pub config: Option<u64>,
}

impl LearnedRecord {
    /// A record of `state`, last true `age` ago (the provider's last use):
    /// re-saving an idle provider's state does not make it younger.
    pub fn of(state: &LearnedState, age: Duration, config: Option<u64>) -> Self {
        LearnedRecord {
            v: VERSION,
            saved_at_unix_ms: unix_ms_now().saturating_sub(age.as_millis() as u64),
            rate_rps: state.rate_rps,
            limit_rps: state.limit_rps,
            baseline_ms: state.baseline.map(|b| b.as_secs_f64() * 1000.0),
            breaker: state.breaker.into(),
            open_remaining_ms: state.open_remaining.map(|d| d.as_millis() as u64),
            allowance_began_unix_ms: state
                .allowance
                .map(|a| unix_ms_now().saturating_sub(a.elapsed.as_millis() as u64)),
            allowance_spent: state.allowance.map(|a| a.spent),
            hold_ms: state.known.hold.map(|h| h.as_millis() as u64),
            limit_fitted: state.known.fitted,
            limit_sharp: state.known.sharp,
            limit_steady: state.known.steady,
            config,
        }
    }

    /// How old it is now.
    pub fn age(&self) -> Duration {
        Duration::from_millis(unix_ms_now().saturating_sub(self.saved_at_unix_ms))
    }

    /// The state to restore, with the breaker's open time reduced by the
    /// time that passed since the save.
    pub fn state(&self) -> LearnedState {
        let age = self.age();
        let breaker = State::from(self.breaker);
        let open_remaining = self
            .open_remaining_ms
            .map(|ms| Duration::from_millis(ms).saturating_sub(age));
        LearnedState {
            rate_rps: self.rate_rps,
            limit_rps: self.limit_rps,
            baseline: self
                .baseline_ms
                .filter(|b| b.is_finite() && *b >= 0.0)
                .map(|b| Duration::from_secs_f64(b / 1000.0)),
            // An open breaker whose time ran out while sluice was down comes
            // back half-open: it probes before trusting the provider again.
            breaker: match (breaker, open_remaining) {
                (State::Open, Some(left)) if left.is_zero() => State::HalfOpen,
                (b, _) => b,
            },
            open_remaining,
            allowance: match (self.allowance_began_unix_ms, self.allowance_spent) {
                (Some(began), Some(spent)) => Some(sluice_policy::pacer::AllowanceUse {
                    elapsed: Duration::from_millis(unix_ms_now().saturating_sub(began)),
                    spent,
                }),
                _ => None,
            },
            known: LimitKnown {
                hold: self.hold_ms.map(Duration::from_millis),
                fitted: self.limit_fitted,
                sharp: self.limit_sharp,
                steady: self.limit_steady,
            },
        }
    }
}

/// One breaker transition as durable evidence (R-CB2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvidenceRecord {
    /// When (wall clock, ms since the epoch).
    pub at_unix_ms: u64,
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Why.
    pub reason: String,
    /// Milliseconds in the previous state.
    pub elapsed_ms: u64,
    /// Calls counted.
    pub calls: u32,
    /// Failures among them.
    pub failures: u32,
    /// Retries left in the budget.
    pub retry_budget_left: Option<u32>,
}

impl EvidenceRecord {
    /// The evidence of `t`, which happened `ago` before now.
    pub fn of(t: &Transition, ago: Duration) -> Self {
        EvidenceRecord {
            at_unix_ms: unix_ms(SystemTime::now() - ago),
            from: t.from.label().to_string(),
            to: t.to.label().to_string(),
            reason: t.reason.label().to_string(),
            elapsed_ms: t.elapsed_ms,
            calls: t.calls,
            failures: t.failures,
            retry_budget_left: t.retry_budget_left,
        }
    }
}
