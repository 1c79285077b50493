//! Accept errors (issue 20): a listener out of file descriptors fails
//! every `accept` until a connection closes. Retrying at once spins and
//! floods the log (192 `accept failed` lines in one second at the file
//! limit); so each failure is counted in `sluice_accept_errors_total`, the
//! listener backs off exponentially (5 ms doubling to 1 s, reset by the
//! next accepted connection), and the log says it once per
//! [`REPORT_EVERY`] with how many failed since the last line.

use std::time::Duration;

use tokio::time::Instant;

use crate::observe::metrics::Metrics;

/// The first back-off after a failure.
const FIRST: Duration = Duration::from_millis(5);
/// The longest back-off: a freed descriptor is used within a second.
const MAX: Duration = Duration::from_secs(1);
/// At most one log line per listener this often.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// One listener's accept failures.
#[derive(Debug)]
pub struct AcceptBackoff {
    listener: &'static str,
    delay: Duration,
    unreported: u64,
    reported_at: Option<Instant>,
}

/// What to do after a failed accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfterFailure {
    /// How long to wait before the next accept.
    pub wait: Duration,
    /// Failures to report now (a log line), if it is time.
    pub report: Option<u64>,
}

impl AcceptBackoff {
    /// No failures yet on `listener` (`proxy` or `admin`).
    pub fn new(listener: &'static str) -> AcceptBackoff {
        AcceptBackoff {
            listener,
            delay: Duration::ZERO,
            unreported: 0,
            reported_at: None,
        }
    }

    /// A connection was accepted: the next failure starts the back-off
    /// over.
    pub fn accepted(&mut self) {
        self.delay = Duration::ZERO;
    }

    /// An accept failed at `now`.
    pub fn failed(&mut self, now: Instant) -> AfterFailure {
        self.delay = if self.delay.is_zero() {
            FIRST
        } else {
            (self.delay * 2).min(MAX)
        };
        self.unreported += 1;
        let due = self
            .reported_at
            .is_none_or(|at| now.saturating_duration_since(at) >= REPORT_EVERY);
        let report = due.then(|| {
            self.reported_at = Some(now);
            std::mem::take(&mut self.unreported)
        });
        AfterFailure {
            wait: self.delay,
            report,
        }
    }

    /// Counts, reports (when due) and waits out one failure.
    pub async fn back_off(&mut self, error: &std::io::Error, metrics: &Metrics) {
        metrics
            .accept_errors
            .with_label_values(&[self.listener])
            .inc();
        let after = self.failed(Instant::now());
        if let Some(failures) = after.report {
            tracing::warn!(
                listener = self.listener,
                %error,
                failures,
                backoff_ms = after.wait.as_millis() as u64,
                "accept failed (out of file descriptors?): backing off; reported at most every {} s",
                REPORT_EVERY.as_secs()
            );
        }
        tokio::time::sleep(after.wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The back-off doubles to its cap and starts over after an accepted
    /// connection; failures are reported at once, then at most once per
    /// interval with the count since the last report.
    #[test]
    fn backs_off_and_reports_once_per_interval() {
        let t0 = Instant::now();
        let mut b = AcceptBackoff::new("proxy");
        let first = b.failed(t0);
        assert_eq!(
            first,
            AfterFailure {
                wait: FIRST,
                report: Some(1)
            }
        );
        let mut waits = Vec::new();
        let mut reports = Vec::new();
        for i in 1..200u64 {
            let a = b.failed(t0 + Duration::from_millis(100 * i));
            waits.push(a.wait);
            reports.extend(a.report);
        }
        assert_eq!(waits[0], FIRST * 2);
        assert_eq!(*waits.last().unwrap(), MAX);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]));
        // 199 failures over 19.9 s: one report at 10 s carrying the 100
        // since the first.
        assert_eq!(reports, [100]);
        b.accepted();
        assert_eq!(b.failed(t0 + Duration::from_secs(30)).wait, FIRST);
    }
}
