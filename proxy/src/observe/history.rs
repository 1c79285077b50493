//! The last minutes of each provider's pace, for the admin page and
//! `sluice status` (R-OP7): a page opened in the middle of an incident
//! shows how the rate got where it is, not only where it is.
//!
//! Every [`EVERY`] a sample per live provider: the pace, the throttle
//! point, and the attempts sent and refused (`429`) since the last sample.
//! [`KEEP`] samples per provider, for at most [`MAX_PROVIDERS`] providers
//! (the sampler takes the ones used last; here, past the bound, the one
//! sampled longest ago gives way): a crawl over thousands of hosts costs a
//! bounded few kilobytes here, not a history per host.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// How often a sample is taken.
pub const EVERY: Duration = Duration::from_secs(5);

/// Samples kept per provider: five minutes.
pub const KEEP: usize = 60;

/// Providers with a history at most.
pub const MAX_PROVIDERS: usize = 64;

/// One sample of one provider.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When (ms since the epoch).
    pub at_unix_ms: u64,
    /// The pace in force.
    pub rate_rps: f32,
    /// Where throttling began, if it has.
    pub throttle_point_rps: Option<f32>,
    /// Attempts sent since the sample before.
    pub sent: u32,
    /// Of those, refused by the provider as throttled.
    pub refused: u32,
}

#[derive(Debug, Default)]
struct Track {
    samples: VecDeque<Sample>,
    /// The attempt counters as of the last sample (sent, refused).
    counted: (u64, u64),
}

/// Every provider's recent samples.
#[derive(Debug, Default)]
pub struct History {
    tracks: Mutex<HashMap<String, Track>>,
}

impl History {
    /// Takes a sample of `provider`: its pace and throttle point now, and
    /// its attempt counters so far (sent, refused), of which the sample
    /// keeps the increase.
    pub fn record(
        &self,
        provider: &str,
        at_unix_ms: u64,
        rate_rps: f64,
        throttle_point_rps: Option<f64>,
        counters: (u64, u64),
    ) {
        let mut tracks = self.tracks.lock().unwrap_or_else(|p| p.into_inner());
        if !tracks.contains_key(provider) && tracks.len() >= MAX_PROVIDERS {
            // The provider sampled longest ago gives way.
            let oldest = tracks
                .iter()
                .min_by_key(|(_, t)| t.samples.back().map_or(0, |s| s.at_unix_ms))
                .map(|(name, _)| name.clone());
            if let Some(name) = oldest {
                tracks.remove(&name);
            }
        }
        let track = tracks.entry(provider.to_string()).or_insert_with(|| Track {
            samples: VecDeque::with_capacity(KEEP),
            counted: counters,
        });
        let delta =
            |now: u64, then: u64| u32::try_from(now.saturating_sub(then)).unwrap_or(u32::MAX);
        let sample = Sample {
            at_unix_ms,
            rate_rps: rate_rps as f32,
            throttle_point_rps: throttle_point_rps.map(|l| l as f32),
            sent: delta(counters.0, track.counted.0),
            refused: delta(counters.1, track.counted.1),
        };
        track.counted = counters;
        if track.samples.len() == KEEP {
            track.samples.pop_front();
        }
        track.samples.push_back(sample);
    }

    /// Forgets providers for which `keep` says no (no longer tracked).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.tracks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|name, _| keep(name));
    }

    /// Every provider's samples, oldest first.
    pub fn all(&self) -> Vec<(String, Vec<Sample>)> {
        let tracks = self.tracks.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = tracks
            .iter()
            .map(|(name, t)| (name.clone(), t.samples.iter().copied().collect()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples keep the increase of the counters, the last [`KEEP`] of
    /// them; at most [`MAX_PROVIDERS`] providers, the stalest giving way.
    #[test]
    fn samples_are_bounded_and_keep_increases() {
        let h = History::default();
        h.record("a", 1_000, 5.0, None, (10, 1));
        h.record("a", 6_000, 6.0, Some(20.0), (40, 4));
        let a = &h.all()[0].1;
        assert_eq!((a[0].sent, a[0].refused), (0, 0), "the first sets the base");
        assert_eq!((a[1].sent, a[1].refused), (30, 3));
        assert_eq!(a[1].throttle_point_rps, Some(20.0));
        for i in 0..(KEEP as u64 + 10) {
            h.record("a", 10_000 + i, 1.0, None, (40, 4));
        }
        assert_eq!(h.all()[0].1.len(), KEEP);
        for p in 0..MAX_PROVIDERS as u64 {
            h.record(&format!("p{p}"), 100_000 + p, 1.0, None, (0, 0));
        }
        let names: Vec<String> = h.all().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names.len(), MAX_PROVIDERS);
        assert!(!names.contains(&"a".to_string()), "the stalest went");
        h.retain(|n| n != "p0");
        assert_eq!(h.all().len(), MAX_PROVIDERS - 1);
    }
}
