//! Every tunable of a provider's stack, with its default and the reason for
//! it — in one place, so that an operator reading one file knows what
//! sluice will do.
//!
//! Only one number is meant to be authored by the owner: the rate ceiling
//! (R-AI2). Everything else has a default that works without tuning; the
//! proxy's config may override any of them per provider.
//!
//! | setting | default | why |
//! |---|---|---|
//! | `ceiling_rps` | 50 | the example of the config contract; the owner's one number |
//! | `start_rps` | ceiling / 10, at most 5; must be below the ceiling | conservative cold start (R-AI3), after Scrapy AutoThrottle's `AUTOTHROTTLE_START_DELAY` (start slow, learn, then go faster) |
//! | `floor_rps` | 0.1 (or the start rate if lower) | one request per 10 s still lets a throttling provider be probed |
//! | `burst` | 1 | strict spacing: GCRA tolerance 0, a request never rides on idle credit (R-GC1) |
//! | `decrease_factor` | 0.7 | the AWS SDKs' adaptive retry mode (CUBIC β = 0.7) |
//! | `increase_window` | 1 s | AIMD evaluates successes once per second, like the AWS SDK's per-second measured rate |
//! | `soft_throttle_factor` | 3 | a lower quartile of time-to-first-byte three times its learned baseline is a provider slowing us down (Scrapy AutoThrottle adjusts on latency too); the quartile, not one answer, so heavy requests are not a throttle (R-SG3) |
//! | `max_queue_wait` | 15 s | a request that would wait longer is refused at once with `Retry-After`; shorter than common 30 s client timeouts |
//! | `max_queue_len` | 256 | the per-provider waiting room; beyond it refuse, never grow memory |
//! | `max_retry_after_wait` | 10 s | a longer `Retry-After` goes back to the client instead of holding its connection |
//! | `max_in_flight` | 64 | the bulkhead: attempts in flight per provider (non-adaptive, R-BH1) |
//! | `attempt_timeout` | 30 s | connect + response head; twice Envoy's 15 s route timeout, since exports are slow |
//! | `breaker_window` | 10 s | Hystrix `metrics.rollingStats.timeInMilliseconds` = 10000 |
//! | `breaker_failure_ratio` | 0.5 | Hystrix `errorThresholdPercentage` = 50, resilience4j `failureRateThreshold` = 50 |
//! | `breaker_min_calls` | 20 | Hystrix `requestVolumeThreshold` = 20: no verdict on fewer calls (no false open on a cold start) |
//! | `breaker_open_for` | 5 s | Hystrix `sleepWindowInMilliseconds` = 5000, Polly `BreakDuration` = 5 s |
//! | `breaker_half_open_probes` | 3 | resilience4j lets a bounded number through half-open (10); fewer here because a proxy's probes are real client requests |
//! | `breaker_wait_for_probe` | false | fail fast while open (R-CB1); opt in to wait for the probe within `max_queue_wait` |
//! | `retry_ratio` | 0.2 | Linkerd / tower `TpsBudget`: retries may add 20 % to the request volume |
//! | `retry_min_per_sec` | 10 | tower `TpsBudget`'s default floor, so a quiet provider can still retry |
//! | `retry_budget_ttl` | 10 s | tower `TpsBudget`'s default: deposits count for ten seconds |
//! | `retry_max_attempts` | 3 | the AWS SDKs' standard mode: three attempts in all |
//! | `retry_base` | 250 ms | full jitter `random(0, min(cap, base·2^n))` (AWS Architecture Blog); base and cap are smaller than the SDK's 1 s / 20 s because a proxy's client waits on its open request |
//! | `retry_cap` | 5 s | see `retry_base` |

use std::time::Duration;

/// A setting that does not make sense, naming the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingsError {
    /// The setting's key, as in the TOML config.
    pub key: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// The tunables of one provider's stack. Build with `Default` or
/// [`ProviderSettings::with_ceiling`], change fields, then [`validate`].
///
/// [`validate`]: ProviderSettings::validate
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSettings {
    /// The owner's one safety number: the learned rate never exceeds it.
    pub ceiling_rps: f64,
    /// The cold-start rate; `None` = ceiling / 10, at most 5 req/s.
    pub start_rps: Option<f64>,
    /// The lowest rate AIMD may fall to.
    pub floor_rps: f64,
    /// GCRA burst: how many requests may go back to back (1 = none).
    pub burst: u32,
    /// Multiplicative decrease on a throttle.
    pub decrease_factor: f64,
    /// How often AIMD considers an increase.
    pub increase_window: Duration,
    /// The lower quartile of recent time-to-first-byte over `baseline ×
    /// factor` is a soft throttle.
    pub soft_throttle_factor: f64,
    /// The longest a request may wait for its pacing slot or bulkhead permit.
    pub max_queue_wait: Duration,
    /// How many requests may wait for a pacing slot.
    pub max_queue_len: usize,
    /// The longest `Retry-After` sluice absorbs for the client.
    pub max_retry_after_wait: Duration,
    /// Attempts in flight to this provider.
    pub max_in_flight: usize,
    /// Per-attempt timeout: connect and response head.
    pub attempt_timeout: Duration,
    /// The breaker's sliding window.
    pub breaker_window: Duration,
    /// Failure share over the window that opens the breaker.
    pub breaker_failure_ratio: f64,
    /// Calls the window must hold before the breaker may open.
    pub breaker_min_calls: u32,
    /// How long the breaker stays open before half-open.
    pub breaker_open_for: Duration,
    /// Probes let through while half-open; this many successes close it.
    pub breaker_half_open_probes: u32,
    /// While open, wait for the half-open probe (within `max_queue_wait`)
    /// instead of failing fast.
    pub breaker_wait_for_probe: bool,
    /// Retries as a share of recent requests.
    pub retry_ratio: f64,
    /// Retries always allowed per second, whatever the ratio.
    pub retry_min_per_sec: u32,
    /// How long a request's deposit counts in the retry budget.
    pub retry_budget_ttl: Duration,
    /// Attempts per request, first included.
    pub retry_max_attempts: u32,
    /// Full-jitter base.
    pub retry_base: Duration,
    /// Full-jitter cap.
    pub retry_cap: Duration,
    /// Methods retried besides the idempotent ones (RFC 9110 §9.2.2).
    pub retry_methods: Vec<http::Method>,
    /// Largest request body kept for replay; bigger bodies are not retried.
    pub replay_limit: usize,
}

impl Default for ProviderSettings {
    fn default() -> Self {
        ProviderSettings {
            ceiling_rps: 50.0,
            start_rps: None,
            floor_rps: 0.1,
            burst: 1,
            decrease_factor: 0.7,
            increase_window: Duration::from_secs(1),
            soft_throttle_factor: 3.0,
            max_queue_wait: Duration::from_secs(15),
            max_queue_len: 256,
            max_retry_after_wait: Duration::from_secs(10),
            max_in_flight: 64,
            attempt_timeout: Duration::from_secs(30),
            breaker_window: Duration::from_secs(10),
            breaker_failure_ratio: 0.5,
            breaker_min_calls: 20,
            breaker_open_for: Duration::from_secs(5),
            breaker_half_open_probes: 3,
            breaker_wait_for_probe: false,
            retry_ratio: 0.2,
            retry_min_per_sec: 10,
            retry_budget_ttl: Duration::from_secs(10),
            retry_max_attempts: 3,
            retry_base: Duration::from_millis(250),
            retry_cap: Duration::from_secs(5),
            retry_methods: Vec::new(),
            replay_limit: 64 * 1024,
        }
    }
}

impl ProviderSettings {
    /// Defaults with the given ceiling.
    pub fn with_ceiling(ceiling_rps: f64) -> Self {
        ProviderSettings {
            ceiling_rps,
            ..Default::default()
        }
    }

    /// The cold-start rate in force: the configured one, or ceiling / 10
    /// capped at 5 req/s — always below the ceiling (R-AI3).
    pub fn start_rate(&self) -> f64 {
        self.start_rps
            .unwrap_or_else(|| (self.ceiling_rps / 10.0).min(5.0))
            .min(self.ceiling_rps)
    }

    /// The floor in force: never above the start rate, so that a cold
    /// start is never forced up to the ceiling by a high floor.
    pub fn floor_rate(&self) -> f64 {
        self.floor_rps.min(self.start_rate())
    }

    /// Checks every value, naming the first bad key.
    pub fn validate(&self) -> Result<(), SettingsError> {
        fn bad(key: &'static str, reason: impl Into<String>) -> Result<(), SettingsError> {
            Err(SettingsError {
                key,
                reason: reason.into(),
            })
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.ceiling_rps) || self.ceiling_rps > 1_000_000.0 {
            return bad("ceiling_rps", "must be a number > 0 and <= 1000000");
        }
        if let Some(s) = self.start_rps {
            if !positive(s) {
                return bad("start_rps", "must be a number > 0");
            }
            if s >= self.ceiling_rps {
                return bad(
                    "start_rps",
                    "must be below ceiling_rps (R-AI3: a cold start never goes at the ceiling)",
                );
            }
        }
        if !positive(self.floor_rps) {
            return bad("floor_rps", "must be a number > 0");
        }
        if self.burst == 0 || self.burst > 10_000 {
            return bad("burst", "must be between 1 and 10000");
        }
        if !(self.decrease_factor > 0.0 && self.decrease_factor < 1.0) {
            return bad("decrease_factor", "must be between 0 and 1 (exclusive)");
        }
        if self.increase_window < Duration::from_millis(10) {
            return bad("increase_window", "must be at least 10ms");
        }
        if !(self.soft_throttle_factor.is_finite() && self.soft_throttle_factor > 1.0) {
            return bad("soft_throttle_factor", "must be a number > 1");
        }
        if self.max_queue_len == 0 {
            return bad("max_queue_len", "must be at least 1");
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1");
        }
        if self.attempt_timeout.is_zero() {
            return bad("attempt_timeout", "must be greater than zero");
        }
        if self.breaker_window < Duration::from_millis(100) {
            return bad("breaker_window", "must be at least 100ms");
        }
        if !(self.breaker_failure_ratio > 0.0 && self.breaker_failure_ratio <= 1.0) {
            return bad("breaker_failure_ratio", "must be in (0, 1]");
        }
        if self.breaker_min_calls == 0 {
            return bad("breaker_min_calls", "must be at least 1");
        }
        if self.breaker_open_for.is_zero() {
            return bad("breaker_open_for", "must be greater than zero");
        }
        if self.breaker_half_open_probes == 0 {
            return bad("breaker_half_open_probes", "must be at least 1");
        }
        if !(self.retry_ratio.is_finite() && (0.0..=10.0).contains(&self.retry_ratio)) {
            return bad("retry_ratio", "must be between 0 and 10");
        }
        if self.retry_budget_ttl < Duration::from_secs(1)
            || self.retry_budget_ttl > Duration::from_secs(60)
        {
            return bad("retry_budget_ttl", "must be between 1s and 60s");
        }
        if self.retry_max_attempts == 0 {
            return bad("retry_max_attempts", "must be at least 1");
        }
        if self.retry_base.is_zero() || self.retry_cap < self.retry_base {
            return bad("retry_base", "must be > 0 and not above retry_cap");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_start_low() {
        let s = ProviderSettings::default();
        s.validate().unwrap();
        assert!(s.start_rate() < s.ceiling_rps);
        assert_eq!(s.start_rate(), 5.0);
        assert_eq!(ProviderSettings::with_ceiling(10.0).start_rate(), 1.0);
        assert_eq!(ProviderSettings::with_ceiling(0.5).start_rate(), 0.05);
        assert_eq!(ProviderSettings::with_ceiling(0.5).floor_rate(), 0.05);
    }

    #[test]
    fn errors_name_the_key() {
        let mut s = ProviderSettings::with_ceiling(-1.0);
        assert_eq!(s.validate().unwrap_err().key, "ceiling_rps");
        s.ceiling_rps = f64::NAN;
        assert_eq!(s.validate().unwrap_err().key, "ceiling_rps");
        s.ceiling_rps = 10.0;
        s.start_rps = Some(20.0);
        assert_eq!(s.validate().unwrap_err().key, "start_rps");
        s.start_rps = None;
        s.decrease_factor = 1.0;
        assert_eq!(s.validate().unwrap_err().key, "decrease_factor");
        s.decrease_factor = 0.7;
        s.burst = 0;
        assert_eq!(s.validate().unwrap_err().key, "burst");
    }
}
