//! Answers logged by a real server standing in for a provider (HAProxy,
//! nginx), by wall clock, and the figures read from them — the same
//! [`Figures`] as the simulator's, so that every provider reads alike.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::sim::Figures;

/// One answer a server gave.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// When it was logged, ms since the Unix epoch.
    pub at_ms: u64,
    /// The status.
    pub status: u16,
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a server answered over `[from, to)` ms since the Unix epoch,
/// against `limit`: every answer but a `200` is a refusal.
pub fn figures(answers: &[Answer], from_ms: u64, to_ms: u64, limit: f64) -> Figures {
    let seen: Vec<_> = answers
        .iter()
        .filter(|a| a.at_ms >= from_ms && a.at_ms < to_ms)
        .collect();
    let accepted = seen.iter().filter(|a| a.status == 200).count();
    let secs = (to_ms - from_ms) as f64 / 1000.0;
    Figures {
        accepted,
        throttled: seen.len() - accepted,
        attempts: seen.len(),
        goodput: accepted as f64 / secs / limit,
        throttled_share: (seen.len() - accepted) as f64 / seen.len().max(1) as f64,
    }
}
