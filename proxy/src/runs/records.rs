//! What runs keep in the store, and their keys. Records hold collector
//! and stream names, numbers, fixed labels and the collectors' own opaque
//! cursors — never a URL, header value or body (R-SF4).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which cursor a run moves (R-RN5): the steady-state one, or the
/// catch-up (backfill) one, kept apart.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Incremental collection.
    #[default]
    Steady,
    /// Historical backfill.
    Catchup,
}

impl Mode {
    /// The word in the API and the store.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Steady => "steady",
            Mode::Catchup => "catchup",
        }
    }

    /// The mode a word names.
    pub fn parse(word: &str) -> Option<Mode> {
        match word {
            "steady" => Some(Mode::Steady),
            "catchup" => Some(Mode::Catchup),
            _ => None,
        }
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Holding the collector's lease.
    Active,
    /// Finished by the collector.
    Finished,
    /// Its lease lapsed: no heartbeat or traffic for `lease_ttl`.
    Expired,
    /// sluice stopped while it was active.
    Interrupted,
}

impl Phase {
    /// The word in the API.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Active => "active",
            Phase::Finished => "finished",
            Phase::Expired => "expired",
            Phase::Interrupted => "interrupted",
        }
    }
}

/// One run, as stored and as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// `collector.seq`.
    pub id: String,
    /// Whose.
    pub collector: String,
    /// Which cursor it moves.
    pub mode: Mode,
    /// Attempts allowed, retries included.
    pub request_cap: Option<u64>,
    /// Seconds from the start after which no attempt starts.
    pub deadline_s: Option<f64>,
    /// Retries as a share of first attempts.
    pub retry_ratio: Option<f64>,
    /// The lease's fencing token.
    pub fencing_token: u64,
    /// When it opened (ms since the epoch).
    pub started_unix_ms: u64,
    /// When it ended.
    pub ended_unix_ms: Option<u64>,
    /// Where it is.
    pub phase: Phase,
    /// Why it stopped, if a budget or source pressure stopped it.
    pub stop_reason: Option<String>,
    /// Providers whose part of the run stopped (source pressure, R-RN8),
    /// with why; the rest of the run went on.
    #[serde(default)]
    pub provider_stops: BTreeMap<String, String>,
    /// Attempts that reached the provider.
    pub attempts: u64,
    /// The units they cost (R-FS2): what the request cap counts; as many
    /// as attempts while every request costs 1.
    #[serde(default)]
    pub units: u64,
    /// Retries among them.
    pub retries: u64,
    /// Waits for source pressure.
    pub cooldown_waits: u64,
    /// Requests sluice refused, by reason.
    pub refusals: BTreeMap<String, u64>,
    /// Gap records written when it stopped.
    pub gaps_recorded: u64,
    /// Gap records the collector posted itself during the run.
    #[serde(default)]
    pub gaps_posted: u64,
    /// Per provider, answers passed to the collector that were the
    /// provider's failures (5xx, `429`, no connection) or sluice's refusal
    /// on its behalf (an outage waited out as long as allowed): a command
    /// that fails after them failed because of that provider.
    #[serde(default)]
    pub failed: BTreeMap<String, u64>,
    /// When its lease lapses (ms since the epoch), as last written: a
    /// restart resumes an active run whose lease has not lapsed (R-RN10).
    #[serde(default)]
    pub lease_until_unix_ms: Option<u64>,
    /// Units (attempts, while each costs 1) reserved in durable blocks
    /// ahead of those spent: a restart resumes the count from here — a
    /// crash may lose part of a block, never give it back (R-RN10).
    #[serde(default)]
    pub attempts_reserved: u64,
    /// Streams it committed checkpoints of.
    #[serde(default)]
    pub streams: Vec<String>,
    /// The providers it sent to: attempts, cool-downs waited out, and
    /// whether its part there stopped.
    #[serde(default)]
    pub providers: BTreeMap<String, RunProvider>,
}

/// A run at one provider, as stored and as the API shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunProvider {
    /// Attempts that left for it.
    pub attempts: u64,
    /// Its cool-down cycles the run waited out.
    pub waits: u64,
    /// Why the run's part there stopped, if it did.
    pub stopped: Option<String>,
}

/// A stream's committed position (R-RN5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The slice number; only ever grows.
    pub slice: u64,
    /// The collector's cursor, byte for byte.
    pub cursor: String,
    /// The run that committed it.
    pub run: String,
    /// When (ms since the epoch).
    pub at_unix_ms: u64,
}

/// Remaining work, deferred and resumable (R-RN6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gap {
    /// `collector.seq`.
    pub id: String,
    /// The stream.
    pub stream: String,
    /// Where to resume: the stream's last committed cursor (`None`: no
    /// checkpoint, start over).
    pub cursor: Option<String>,
    /// Why the work was deferred.
    pub reason: String,
    /// The collector's note (records it could not hydrate).
    pub detail: Option<String>,
    /// The run that recorded it.
    pub run: Option<String>,
    /// The provider whose part of the run stopped, when only its part did
    /// (R-RN8).
    #[serde(default)]
    pub provider: Option<String>,
    /// The mode of the cursor it resumes from (R-RN12); `None` in records
    /// kept before modes were.
    #[serde(default)]
    pub mode: Option<Mode>,
    /// The checkpoint's slice the cursor is at: a later run's commit past
    /// it resolves a stop's gap.
    #[serde(default)]
    pub slice: Option<u64>,
    /// A stop recorded it (not the collector): the next stop's gap of its
    /// stream and mode supersedes it, and a later run's commit past its
    /// cursor resolves it. Gaps a collector posts stay until resolved.
    #[serde(default)]
    pub stop: bool,
    /// When (ms since the epoch).
    pub at_unix_ms: u64,
}

/// The largest gap page a reader may ask for (`max_bytes`): a page is
/// built in memory, so it is bounded.
pub const MAX_GAP_PAGE_BYTES: usize = 1024 * 1024;

/// Gap reasons: a budget ran out (planned), or source pressure.
pub const GAP_REASONS: [&str; 9] = [
    "request_cap",
    "deadline",
    "retry_budget",
    "throttled",
    "circuit_open",
    "retry_after",
    "upstream_error",
    // A run that ended without a stop: its lease lapsed while sluice ran,
    // or while sluice was down (R-RN10).
    "expired",
    "interrupted",
];

/// The store key of `collector`'s record number `seq` (runs, gaps).
pub fn seq_key(collector: &str, seq: u64) -> Vec<u8> {
    let mut k = prefix(collector);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The key prefix of everything of `collector`.
pub fn prefix(collector: &str) -> Vec<u8> {
    let mut k = collector.as_bytes().to_vec();
    k.push(0);
    k
}

/// The store key of a checkpoint.
pub fn checkpoint_key(collector: &str, mode: Mode, stream: &str) -> Vec<u8> {
    let mut k = prefix(collector);
    k.extend_from_slice(mode.label().as_bytes());
    k.push(0);
    k.extend_from_slice(stream.as_bytes());
    k
}

/// `collector.seq` → its parts.
pub fn split_id(id: &str) -> Option<(&str, u64)> {
    let (collector, seq) = id.rsplit_once('.')?;
    if collector.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((collector, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_on_the_last_dot() {
        assert_eq!(split_id("collector.a.17"), Some(("collector.a", 17)));
        assert_eq!(split_id("c.0"), Some(("c", 0)));
        assert_eq!(split_id("c."), None);
        assert_eq!(split_id(".3"), None);
        assert_eq!(split_id("c.x1"), None);
        assert_eq!(split_id("nodot"), None);
    }

    #[test]
    fn keys_sort_by_number_within_a_collector() {
        assert!(seq_key("a", 2) < seq_key("a", 10));
        assert!(seq_key("a", u64::MAX) < prefix("a\u{1}"));
        assert!(checkpoint_key("a", Mode::Steady, "s").starts_with(&prefix("a")));
        assert!(!checkpoint_key("ab", Mode::Steady, "s").starts_with(&prefix("a")));
    }
}
