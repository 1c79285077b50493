//! Values in one word where `Option` takes two (issue 38, R-PF1): every
//! tracked host keeps a few of them, and a broad crawl tracks a hundred
//! thousand hosts.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// An `Option<f64>` in one word: none is NaN, which no value kept here is
/// (a rate, a quartile).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OptF64(f64);

impl Default for OptF64 {
    fn default() -> Self {
        OptF64(f64::NAN)
    }
}

impl From<Option<f64>> for OptF64 {
    fn from(value: Option<f64>) -> Self {
        OptF64(value.filter(|v| !v.is_nan()).unwrap_or(f64::NAN))
    }
}

impl OptF64 {
    pub(crate) fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }
}

/// The instant every [`Moment`] counts from: the first one this process
/// asked for (tokio's clock, so that paused time drives it as it drives
/// the rest).
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// An `Option<Instant>` in one word: nanoseconds from the process's
/// origin, either way (±292 years), none as `i64::MIN`. An `Instant` is
/// twelve bytes and its `Option` sixteen.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moment(i64);

impl Default for Moment {
    fn default() -> Self {
        Moment::NONE
    }
}

impl std::fmt::Debug for Moment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl From<Option<Instant>> for Moment {
    fn from(at: Option<Instant>) -> Self {
        at.map_or(Moment::NONE, Moment::at)
    }
}

impl Moment {
    pub(crate) const NONE: Moment = Moment(i64::MIN);

    pub(crate) fn at(at: Instant) -> Moment {
        let origin = origin();
        let ns = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match at.checked_duration_since(origin) {
            Some(after) => Moment(ns(after)),
            None => Moment((-ns(origin - at)).max(i64::MIN + 1)),
        }
    }

    pub(crate) fn get(self) -> Option<Instant> {
        if self == Moment::NONE {
            return None;
        }
        let origin = origin();
        let d = Duration::from_nanos(self.0.unsigned_abs());
        Some(if self.0 >= 0 { origin + d } else { origin - d })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moment_is_its_instant_to_the_nanosecond() {
        let now = Instant::now();
        for at in [
            now,
            now + Duration::from_nanos(1),
            now + Duration::from_secs(86_400 * 365),
            now - Duration::from_secs(3),
            origin(),
            origin() - Duration::from_nanos(1),
        ] {
            assert_eq!(Moment::at(at).get(), Some(at));
        }
        assert_eq!(Moment::from(None).get(), None);
        assert_eq!(Moment::default(), Moment::NONE);
        assert_eq!(std::mem::size_of::<Moment>(), 8);
    }

    #[test]
    fn an_opt_f64_is_its_option() {
        for v in [
            None,
            Some(0.0),
            Some(-1.5),
            Some(f64::INFINITY),
            Some(1e-300),
        ] {
            assert_eq!(OptF64::from(v).get(), v);
        }
        assert_eq!(OptF64::from(Some(f64::NAN)).get(), None);
        assert_eq!(OptF64::default().get(), None);
    }
}
