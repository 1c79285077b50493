//! A tokens budget beside the requests one (R-PD1, R-PD5): an LLM
//! provider limits tokens a minute as well as requests (OpenAI's
//! `x-ratelimit-*-tokens`, Anthropic's `anthropic-ratelimit-tokens-*`),
//! and with requests of a few hundred tokens the tokens bind first.
//!
//! What a request costs in tokens is the provider's to say, and it says
//! it in every answer: the tokens remaining. Between two answers the
//! budget refilled at its rate and lost what the requests in between were
//! charged; summed over a few answers, that is the tokens per request —
//! learned from the provider's own ledger, not estimated by sluice (the
//! latest header always beats an estimate). The budget then paces
//! requests at its refill over the tokens per request, and holds when
//! less than a request's worth remains, until it has refilled.

use super::put;
use super::*;

/// Answers summed into one sample of the tokens per request.
const SAMPLE: u32 = 8;

/// How much a new sample moves the learned tokens per request.
const WEIGHT: f64 = 0.3;

/// A tokens budget as the pacer follows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TokenBudget {
    /// The last advertisement.
    pub(super) told: Advertised,
    /// When it came.
    at: Instant,
    /// Tokens charged since the last sample, and the answers in between.
    charged: f64,
    answers: u32,
    /// Tokens a request costs, learned from the provider's ledger.
    pub(super) per_request: Option<f64>,
}

/// The tokens budget, for the readout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokensSnapshot {
    /// The last advertisement (limit, remaining, refill).
    pub told: Advertised,
    /// Tokens a request costs, once learned.
    pub per_request: Option<f64>,
    /// The requests a second it allows (its refill over the tokens per
    /// request), once that is learned.
    pub rate_rps: Option<f64>,
}

impl TokenBudget {
    /// Requests a second the budget allows: its refill over what a
    /// request costs.
    pub(super) fn rate(&self) -> Option<f64> {
        let refill = self.told.policy_rate()?;
        let per = self.per_request.filter(|p| *p > 0.0)?;
        Some(refill / per)
    }

    /// The readout.
    pub(super) fn snapshot(&self) -> TokensSnapshot {
        TokensSnapshot {
            told: self.told,
            per_request: self.per_request,
            rate_rps: self.rate(),
        }
    }
}

impl PacerCore {
    /// What an answer's tokens budget says: learn what a request costs
    /// from how much the budget lost since the last answer, pace at its
    /// refill over that, and hold while less than a request's worth
    /// remains.
    pub fn on_tokens(&mut self, told: Advertised, now: Instant) -> Feedback {
        let mut fb = Feedback::default();
        let refill = told.policy_rate().unwrap_or(0.0);
        let mut b = match self.rare.tokens().copied() {
            Some(mut b) => {
                let before = b.told.remaining as f64;
                let room = told.limit.map_or(f64::MAX, |l| l as f64) - before;
                let refilled =
                    (refill * now.saturating_duration_since(b.at).as_secs_f64()).min(room.max(0.0));
                b.charged += (before + refilled - told.remaining as f64).max(0.0);
                b.answers += 1;
                if b.answers >= SAMPLE {
                    let sample = b.charged / f64::from(b.answers);
                    b.per_request =
                        Some(b.per_request.map_or(sample, |p| p + WEIGHT * (sample - p)));
                    b.charged = 0.0;
                    b.answers = 0;
                }
                TokenBudget { told, at: now, ..b }
            }
            None => TokenBudget {
                told,
                at: now,
                charged: 0.0,
                answers: 0,
                per_request: None,
            },
        };
        if let Some(per) = b.per_request {
            let short = per - told.remaining as f64;
            if short > 0.0 && refill > 0.0 {
                let until = now + Duration::from_secs_f64(short / refill);
                fb.hold_until = self.hold(now, until, HoldCause::Refill);
                fb.hold_cause = HoldCause::Refill;
            }
        }
        let before = self.gcra.interval();
        b.told = told;
        put(&mut self.rare.made().tokens, b);
        self.sync_interval();
        fb.increased = self.gcra.interval() < before;
        fb
    }
}
