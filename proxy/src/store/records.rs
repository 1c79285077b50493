//! What the store keeps per provider: the learned state (a binary record
//! of a few dozen bytes; JSON before, still read) and the breaker evidence
//! (JSON) — provider names, numbers and fixed labels only (R-SF4).

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

/// The first byte of a binary learned-state record (a JSON one's is `{`).
const BINARY: u8 = 0xB1;

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

    /// The record as stored: 20 bytes and 8 per figure it has (at most
    /// 76), where its JSON took about 300 — a broad crawl keeps one per
    /// host (issue 38, R-PF1). Its first byte tells it from a JSON record
    /// (`{`), which [`LearnedRecord::decode`] still reads.
    pub fn encode(&self) -> Vec<u8> {
        let figures = [
            self.limit_rps.map(f64::to_bits),
            self.baseline_ms.map(f64::to_bits),
            self.open_remaining_ms,
            self.allowance_began_unix_ms,
            self.allowance_spent.map(f64::to_bits),
            self.hold_ms,
            self.config,
        ];
        let mut out = Vec::with_capacity(20 + 8 * figures.len());
        out.push(BINARY);
        out.push(match self.breaker {
            StoredBreaker::Closed => 0,
            StoredBreaker::Open => 1,
            StoredBreaker::HalfOpen => 2,
            StoredBreaker::Unknown => 255,
        });
        out.push(
            u8::from(self.limit_fitted)
                | u8::from(self.limit_sharp) << 1
                | u8::from(self.limit_steady) << 2,
        );
        let present = figures
            .iter()
            .enumerate()
            .fold(0u8, |bits, (i, f)| bits | u8::from(f.is_some()) << i);
        out.push(present);
        out.extend_from_slice(&self.saved_at_unix_ms.to_le_bytes());
        out.extend_from_slice(&self.rate_rps.to_bits().to_le_bytes());
        for f in figures.into_iter().flatten() {
            out.extend_from_slice(&f.to_le_bytes());
        }
        out
    }

    /// A stored record: the binary form, or the JSON an earlier version
    /// wrote. `None` for anything else (a truncated or foreign value).
    pub fn decode(bytes: &[u8]) -> Option<LearnedRecord> {
        let (&first, rest) = bytes.split_first()?;
        if first != BINARY {
            return serde_json::from_slice(bytes).ok();
        }
        let (&[breaker, known, present], rest) = rest.split_first_chunk::<3>()?;
        let mut words = rest.chunks_exact(8).map(|c| {
            let mut b = [0; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        });
        if rest.len() != 8 * (2 + present.count_ones() as usize) || present >> 7 != 0 {
            return None;
        }
        let saved_at_unix_ms = words.next()?;
        let rate_rps = f64::from_bits(words.next()?);
        let mut figure = |i: u8| (present >> i & 1 == 1).then(|| words.next()).flatten();
        let limit_rps = figure(0).map(f64::from_bits);
        let baseline_ms = figure(1).map(f64::from_bits);
        let open_remaining_ms = figure(2);
        let allowance_began_unix_ms = figure(3);
        let allowance_spent = figure(4).map(f64::from_bits);
        let hold_ms = figure(5);
        let config = figure(6);
        Some(LearnedRecord {
            v: VERSION,
            saved_at_unix_ms,
            rate_rps,
            limit_rps,
            baseline_ms,
            breaker: match breaker {
                0 => StoredBreaker::Closed,
                1 => StoredBreaker::Open,
                2 => StoredBreaker::HalfOpen,
                _ => StoredBreaker::Unknown,
            },
            open_remaining_ms,
            allowance_began_unix_ms,
            allowance_spent,
            hold_ms,
            limit_fitted: known & 1 != 0,
            limit_sharp: known & 2 != 0,
            limit_steady: known & 4 != 0,
            config,
        })
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
