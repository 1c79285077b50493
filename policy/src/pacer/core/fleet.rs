//! A fleet's pace (R-DS1): what this replica proposes to the shared
//! budget, and the shared rate it adopts.

use super::quota::FleetCount;
use super::*;
use crate::pacer::shared::Seat;

/// Where a replica going alone puts its first request (R-DS2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AloneStart {
    /// Its seat's next slot on the store's clock.
    Seat(Seat),
    /// A phase, 0–1, of one interval alone (no seat: drawn at random).
    Phase(f64),
}

impl AloneStart {
    /// How long from now the first request alone is due, when each of
    /// `replicas` sends once an `interval`: a seat's slots are every
    /// `replicas`-th of a grid `interval / replicas` apart that begins at
    /// the store clock's epoch — the same grid for every replica that
    /// paces by the same rate, in whole nanoseconds (no rounding apart).
    fn first_slot(self, interval: Duration, replicas: u32) -> Duration {
        match self {
            AloneStart::Seat(seat) => {
                let n = u128::from(replicas.max(1));
                let step = (interval.as_nanos() / n).max(1);
                let clock = seat.clock.as_nanos();
                let next = clock.div_ceil(step);
                let mine = next + (u128::from(seat.index) % n + n - next % n) % n;
                Duration::from_nanos(u64::try_from(mine * step - clock).unwrap_or(u64::MAX))
            }
            AloneStart::Phase(phase) => {
                let phase = if phase.is_finite() {
                    phase.clamp(0.0, 1.0)
                } else {
                    0.0
                };
                interval.mul_f64(phase)
            }
        }
    }
}

impl PacerCore {
    /// What this replica proposes to a shared budget nobody has started
    /// (or one a new primary lost): its learned rate and throttle point,
    /// and the hold it knows of — never a start from zero (R-DS2).
    pub fn proposal(&self, now: Instant) -> Proposal {
        // What it learned alone is not the fleet's: no more than the
        // shared rate it last paced by.
        let fleet = self.rare.fleet();
        let rate = match (
            fleet.and_then(|f| f.alone),
            fleet.and_then(|f| f.shared_rate),
        ) {
            (Some(_), Some(shared)) => self.aimd.rate().min(shared),
            _ => self.aimd.rate(),
        };
        Proposal {
            rate,
            limit: self.aimd.limit(),
            units: 1,
            allowance: self.rare.allowance().map(AllowanceState::allowance),
            hold: fleet
                .and_then(|f| f.hold)
                .filter(|h| *h > now)
                .map(|h| h - now),
        }
    }

    /// The shared budget answered (R-DS1): its rate, throttle point and
    /// hold become this replica's. Pacing alone (if it was) ends after a
    /// rejoin: its share is kept a while longer — `retry` (how long a
    /// replica that found the store unreachable waits before asking
    /// again) and two of its intervals alone — since the other replicas
    /// may not have found the store back yet and still pace alone; this
    /// one taking every shared slot meanwhile would make the fleet send
    /// its rate and theirs at once (R-DS2).
    pub fn adopt_shared(&mut self, view: &SharedView, now: Instant, retry: Duration) -> Feedback {
        let mut fb = Feedback::default();
        let before = self.gcra.interval();
        let fleet = self.rare.made().fleet.get_or_insert_with(Box::default);
        if fleet.alone.is_some() {
            match fleet.rejoining {
                None => fleet.rejoining = Some(now + retry + self.gcra.interval() * 2),
                Some(until) if now >= until => {
                    fleet.alone = None;
                    fleet.rejoining = None;
                    self.aimd.set_alone(false);
                }
                Some(_) => {}
            }
        }
        fleet.shared_rate = Some(view.rate);
        // The fleet's refusal before the cut it brought: its limit is
        // judged with the point in the fit.
        if let Some(refusal) = view.refusal {
            self.aimd.on_fleet_refusal(now, refusal);
        }
        // The hold first: a cut it came with is judged knowing the
        // provider holds.
        let hold = view.hold.filter(|h| !h.is_zero());
        if let Some(hold) = hold {
            self.aimd.on_shared_hold(now, hold);
        }
        if let Some(held) = view.held {
            self.aimd.on_hold(held);
        }
        self.aimd.adopt(now, view.rate, view.limit);
        // Every replica's admissions since this replica last asked: the
        // window's demand and delivery are the provider's, not this
        // replica's share of them.
        let fleet = self.rare.made().fleet.get_or_insert_with(Box::default);
        if let Some((prev, at)) = fleet.shared_count.filter(|(p, _)| view.admitted > *p) {
            let n = u32::try_from(view.admitted - prev).unwrap_or(u32::MAX);
            let held = self.hold_until.is_some_and(|h| h.at() > at);
            let span = (!held).then(|| now.saturating_duration_since(at));
            self.aimd.on_shared_admitted(now, n, span);
        }
        if fleet.shared_count.is_none_or(|(p, _)| view.admitted != p) {
            fleet.shared_count = Some((view.admitted, now));
        }
        if let Some(hold) = hold {
            // The fleet's hold, as the store keeps it (not reported back).
            fb.hold_until = self.hold(now, now + hold, HoldCause::Refused);
        }
        // The allowance as every replica spent it (the readout, the store,
        // and this replica's pace should the store stop answering).
        if let (Some(used), Some(a)) = (view.allowance, self.rare.allowance_mut()) {
            a.restore(now, used);
        }
        self.sync_interval();
        // Faster or slower, waiters' slots moved (it is not this replica's
        // cut or raise: nothing to report back).
        fb.increased = self.gcra.interval() != before;
        fb
    }

    /// The shared budget could not answer: pace alone at one share of the
    /// last shared rate until it answers again. Going alone, the first
    /// request here is due at `start` — the next slot of this replica's
    /// seat on the store's clock, or a phase (0–1) of one interval alone —
    /// with no burst credit: replicas that lose the store together then
    /// send their shares interleaved over the interval, not all at once on
    /// top of the slots the shared schedule just gave (R-DS2).
    pub fn pace_alone(&mut self, replicas: u32, now: Instant, start: AloneStart) -> Feedback {
        let before = self.gcra.interval();
        let fleet = self.rare.made().fleet.get_or_insert_with(Box::default);
        let fresh = fleet.alone.is_none();
        fleet.alone = Some(replicas.max(1));
        fleet.rejoining = None;
        self.aimd.set_alone(true);
        self.sync_interval();
        if fresh {
            let first = start.first_slot(self.gcra.interval(), replicas);
            self.gcra.restart_at(now + first);
        }
        Feedback {
            increased: self.gcra.interval() != before,
            ..Feedback::default()
        }
    }

    /// The rate is a fleet's: a shared budget has answered (or did, and
    /// this replica paces alone at its share for now).
    pub fn sharing(&self) -> bool {
        self.rare
            .fleet()
            .is_some_and(|f| f.shared_rate.is_some() || f.alone.is_some())
    }

    /// Whether this replica paces alone because its shared budget is
    /// unreachable.
    pub fn alone(&self) -> bool {
        self.rare.fleet().is_some_and(|f| f.alone.is_some())
    }

    /// This replica took a slot of the shared budget.
    pub fn admitted_here(&mut self) {
        self.aimd.on_admitted_here();
        self.rare.made().fleet.get_or_insert_with(Box::default).here += 1;
    }

    /// The shared slots this replica and every replica have taken, while
    /// a shared budget counts them.
    pub(super) fn fleet_count(&self) -> Option<FleetCount> {
        let fleet = self.rare.fleet()?;
        let (all, _) = fleet.shared_count?;
        Some(FleetCount {
            here: fleet.here,
            all,
        })
    }

    /// A shared budget made this replica's request wait: its demand
    /// saturates the shared pace.
    pub fn pressed(&mut self) {
        self.aimd.on_pressed();
    }
}
