//! A budget shared by replicas (R-DS1): the seam between the pacer and
//! whatever holds the one schedule all replicas pace by.
//!
//! A provider's limit belongs to its credential, not to a pod. With a
//! shared budget the pacer still queues its own requests (FIFO, bounded
//! wait), but a request locally admitted must also take the provider's
//! next slot in the shared schedule; what one replica learns — a cut, a
//! raise, a `Retry-After` hold — is reported to it, and every admission
//! brings back the rate and hold all replicas pace by. The proxy implements
//! it over Redis; the policy only knows this trait, so pacing stays pure
//! and testable with a clock.
//!
//! When the shared store cannot answer within its call timeout, `admit`
//! answers `None` and the pacer paces alone at its share of the last shared
//! rate (`rate / replicas`): degraded, never failing a request for it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

/// Pacing alone, a replica takes this much of its share (`rate /
/// replicas`): in their seats (see [`Seat`]) the replicas' sends stay
/// interleaved, but a wake-up late on a busy host, two replicas sharing a
/// seat after a restart, or a replica without one (it goes at a random
/// phase) can still put two sends close together; a tenth spare keeps such
/// a second within the rate (R-DS2).
pub const ALONE_SHARE: f64 = 0.9;

/// Where a replica's sends go while every replica paces alone (R-DS2): its
/// seat among the replicas, and the shared store's clock as this replica
/// reads it. Replicas pacing alone at one share of one rate each take every
/// `replicas`-th slot of one grid on that clock — their seat's — so
/// together they send interleaved, as the shared schedule had them, not at
/// phases of their own (eight replicas at random phases put twelve sends
/// in a second of a ten-a-second fleet in about one second of twenty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seat {
    /// This replica's seat, `0..replicas` (two replicas may share one when
    /// one of them restarted: they then send together, the rest apart).
    pub index: u32,
    /// The store's clock now (since the Unix epoch), as this replica
    /// reads it: every replica reading the same store reads the same time
    /// within a round trip, whatever its own clock says.
    pub clock: Duration,
}

/// The future a shared budget's admission returns.
pub type AdmitFuture<'a> = Pin<Box<dyn Future<Output = Option<SharedAdmit>> + Send + 'a>>;

/// What one replica knows when it asks for a shared slot: used to start a
/// budget nobody has started yet (or one the store lost).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proposal {
    /// This replica's learned rate.
    pub rate: f64,
    /// Where this replica saw throttling begin, if it did.
    pub limit: Option<f64>,
    /// The units the request asking costs (R-FS2): it takes as many of
    /// the shared schedule's slots.
    pub units: u32,
    /// The provider's long-horizon allowance, if it has one: spent by
    /// every replica together, paced to last its period (R-FS2).
    pub allowance: Option<crate::pacer::Allowance>,
    /// What is left of a hold this replica knows of: a budget that lost it
    /// (a new primary without the last writes) holds every replica again.
    pub hold: Option<Duration>,
}

/// The shared state, as an admission found it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedView {
    /// The rate all replicas pace by together.
    pub rate: f64,
    /// Where throttling began, as any replica saw it.
    pub limit: Option<f64>,
    /// Time left on a hold any replica was told of.
    pub hold: Option<Duration>,
    /// Units admitted by every replica so far (a counter; 0 if not kept).
    pub admitted: u64,
    /// How far the shared allowance's period has got, if one is kept.
    pub allowance: Option<crate::pacer::AllowanceUse>,
    /// The fleet's last refusal after a hold, if the store keeps it.
    pub refusal: Option<FleetRefusal>,
    /// How long the provider's last hold was (its `Retry-After`), as any
    /// replica was told.
    pub held: Option<Duration>,
}

/// A refusal that held every replica, as the shared store counted it (the
/// time is its own, and the admissions every replica's): how long after
/// the previous hold's end it came, and what the fleet sent in between —
/// what one sluice's token-bucket fit reads from its own sends (R-SG5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetRefusal {
    /// Which refusal (the store's time of it, in its own clock): a replica
    /// reads each once.
    pub id: u64,
    /// How long ago it came.
    pub ago: Duration,
    /// From the previous hold's end to it.
    pub after: Duration,
    /// Units every replica admitted in that time.
    pub sent: u64,
}

/// The answer to one shared admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedAdmit {
    /// The slot was taken: send now.
    pub admitted: bool,
    /// Not admitted: the next slot is this far away (sleep, then ask again).
    pub wait: Duration,
    /// The shared state.
    pub view: SharedView,
}

/// What one replica learned, for all of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SharedChange {
    /// A throttle to a request sent at `sent_at` cut the rate to `rate`.
    /// Applied once per congestion epoch: a request sent before the last
    /// shared cut cuts nothing (the whole overshoot is one cut).
    Cut {
        /// When the throttled request was sent.
        sent_at: Instant,
        /// The rate after the cut.
        rate: f64,
        /// Where throttling began.
        limit: Option<f64>,
    },
    /// Clean, saturated windows grew the rate to `rate`: applied at most
    /// once per `every` (the increase window), so replicas growing from the
    /// same rate grow it once.
    Raise {
        /// The proposed rate.
        rate: f64,
        /// The throttle point after the raise (`None` when a probe found
        /// it moved).
        limit: Option<f64>,
        /// At most one raise this often.
        every: Duration,
    },
    /// Every request waits until `until`: the provider asked (a
    /// refusal), or its advertised quota is spent until its reset.
    Hold {
        /// The end of the hold.
        until: Instant,
        /// A refusal (`Retry-After`) brought it: the fleet's fit counts
        /// it; a spent quota's hold refused nothing.
        refused: bool,
    },
}

/// A budget shared with other replicas. Implementations bound every call
/// by a timeout and never fail a request: `None` from `admit` means
/// "pace alone for now".
pub trait SharedBudget: Send + Sync {
    /// Takes the provider's next slot, or says how far away it is.
    fn admit(&self, proposal: Proposal) -> AdmitFuture<'_>;
    /// Reports what this replica learned (fire and forget).
    fn report(&self, change: SharedChange);
    /// How many replicas share the budget: a replica pacing alone takes
    /// this share of the last shared rate.
    fn replicas(&self) -> u32;
    /// How long a replica that found the store unreachable waits before
    /// asking it again: a replica answered again keeps its share this long
    /// (and two of its intervals alone), while others may still pace
    /// alone.
    fn retry_every(&self) -> Duration;
    /// How long a replica pacing by the shared schedule waits, its next
    /// request held, before asking once more when a call fails — rather
    /// than going alone at once. A call that fails for this replica alone
    /// (a stalled client, a timeout under load) leaves the others taking
    /// every shared slot, and its sends alone would come on top of theirs;
    /// asked again, the store usually answers. Only a second miss is an
    /// outage (R-DS2). Zero: alone at once.
    fn recheck_after(&self) -> Duration {
        Duration::ZERO
    }
    /// This replica's seat and the store's clock, once the store gave it a
    /// seat: where its sends go when it paces alone. `None`: it goes alone
    /// at a random phase.
    fn seat(&self) -> Option<Seat> {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::pacer::PacerShared;
    use crate::settings::ProviderSettings;

    /// One schedule in memory, as the proxy keeps it in Redis: strict GCRA
    /// at the shared rate, the hold, the cut epoch.
    #[derive(Default)]
    struct Store {
        tat: Option<Instant>,
        rate: Option<f64>,
        hold: Option<Instant>,
        cut_at: Option<Instant>,
        up: bool,
        cuts: u32,
    }

    struct Fake(Mutex<Store>);

    impl SharedBudget for Fake {
        fn admit(&self, proposal: Proposal) -> AdmitFuture<'_> {
            let now = Instant::now();
            let mut s = self.0.lock().unwrap();
            let answer = s.up.then(|| {
                let rate = *s.rate.get_or_insert(proposal.rate);
                let at = [s.tat, s.hold]
                    .into_iter()
                    .flatten()
                    .fold(now, Instant::max);
                let admitted = at <= now;
                if admitted {
                    let due = s.tat.unwrap_or(now).max(now - crate::pacer::SHARED_SLACK);
                    s.tat = Some(
                        due + Duration::from_secs_f64(f64::from(proposal.units.max(1)) / rate),
                    );
                }
                SharedAdmit {
                    admitted,
                    wait: at - now,
                    view: SharedView {
                        rate,
                        limit: None,
                        hold: s.hold.map(|h| h.saturating_duration_since(now)),
                        admitted: 0,
                        allowance: None,
                        refusal: None,
                        held: None,
                    },
                }
            });
            Box::pin(async move { answer })
        }

        fn report(&self, change: SharedChange) {
            let mut s = self.0.lock().unwrap();
            match change {
                SharedChange::Cut { sent_at, rate, .. } => {
                    if s.cut_at.is_none_or(|c| sent_at > c) {
                        s.rate = Some(rate);
                        s.cut_at = Some(Instant::now());
                        s.cuts += 1;
                    }
                }
                SharedChange::Raise { .. } => {}
                SharedChange::Hold { until, .. } => {
                    s.hold = Some(s.hold.map_or(until, |h| h.max(until)));
                }
            }
        }

        fn replicas(&self) -> u32 {
            2
        }

        fn retry_every(&self) -> Duration {
            Duration::from_secs(1)
        }
    }

    /// Two replicas, each with saturating demand, for `secs`: how many
    /// each sent.
    async fn run(pacers: &[Arc<PacerShared>], secs: u64) -> Vec<u32> {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for p in pacers {
            for _ in 0..4 {
                let p = p.clone();
                tasks.push(tokio::spawn(async move {
                    let mut sent = 0;
                    while Instant::now() < end {
                        if p.acquire().await.is_ok_and(|at| at < end) {
                            sent += 1;
                        }
                    }
                    sent
                }));
            }
        }
        let mut per = vec![0; pacers.len()];
        for (i, t) in tasks.into_iter().enumerate() {
            per[i / 4] += t.await.unwrap();
        }
        per
    }

    /// The shared store, answering.
    fn store_up() -> Arc<Fake> {
        Arc::new(Fake(Mutex::new(Store {
            up: true,
            ..Store::default()
        })))
    }

    fn replicas(fake: &Arc<Fake>) -> Vec<Arc<PacerShared>> {
        (0..2)
            .map(|_| {
                let p = PacerShared::new(&ProviderSettings::with_ceiling(50.0));
                p.set_budget(Some(fake.clone() as Arc<dyn SharedBudget>));
                p
            })
            .collect()
    }

    /// R-FS2: a 10-unit request takes ten of the shared schedule's slots.
    /// Two replicas, one sending 10-unit requests and one 1-unit ones, at
    /// the cold 5 units a second for 10 s: about 50 units together, not
    /// 50 requests.
    #[tokio::test(start_paused = true)]
    async fn a_costly_request_takes_as_many_shared_slots() {
        let fake = store_up();
        let pacers = replicas(&fake);
        let end = Instant::now() + Duration::from_secs(10);
        let mut tasks = Vec::new();
        for (p, units) in pacers.iter().zip([10u32, 1]) {
            for _ in 0..2 {
                let p = p.clone();
                tasks.push(tokio::spawn(async move {
                    // The 1-unit replica asks first. Told of the same slot,
                    // replicas wake a random 0-2 ms apart — but on tokio's
                    // 1 ms timer ticks, and in a tie the timer's order
                    // decides: the 1-unit one lost all five 10-unit slots
                    // in about a quarter of runs when both began at once.
                    if units == 10 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    let mut spent = 0;
                    while Instant::now() < end {
                        let class = crate::pacer::Class::default();
                        if p.acquire_as(&class, units, None)
                            .await
                            .is_ok_and(|at| at < end)
                        {
                            spent += units;
                        }
                    }
                    (units, spent)
                }));
            }
        }
        let mut by = [0u32; 2];
        for t in tasks {
            let (units, spent) = t.await.unwrap();
            by[usize::from(units == 1)] += spent;
        }
        let total = by[0] + by[1];
        assert!((49..=62).contains(&total), "units {by:?}");
        assert!(by[0] >= 10 && by[1] >= 1, "both went: {by:?}");
    }

    /// R-DS1: two replicas pace by one schedule — together at the shared
    /// rate, not each at it — and one replica's hold holds the other;
    /// with the store down each paces alone at its share.
    #[tokio::test(start_paused = true)]
    async fn replicas_pace_by_one_schedule_and_one_hold() {
        let fake = store_up();
        let pacers = replicas(&fake);
        let per = run(&pacers, 10).await;
        let total: u32 = per.iter().sum();
        // The cold start, 5 req/s, over 10 s: 50 together.
        assert!((49..=52).contains(&total), "{per:?}");
        assert!(per.iter().all(|&n| n >= 15), "both got a share: {per:?}");

        // A hold one replica was told of holds the other.
        let sent = Instant::now();
        pacers[0].feedback(
            Some(crate::classify::Outcome::Throttled {
                status: 429,
                retry_after: Some(Duration::from_secs(3)),
            }),
            sent,
            None,
        );
        assert_eq!(fake.0.lock().unwrap().cuts, 1, "the cut is shared");
        let before = Instant::now();
        pacers[1].acquire().await.unwrap();
        assert!(
            Instant::now() - before >= Duration::from_secs(3),
            "held by the other replica's Retry-After"
        );
        // The same overshoot seen by the other replica cuts nothing more.
        pacers[1].feedback(
            Some(crate::classify::Outcome::Throttled {
                status: 429,
                retry_after: None,
            }),
            sent,
            None,
        );
        assert_eq!(fake.0.lock().unwrap().cuts, 1, "one cut per epoch");

        // The store down: each paces alone at its share (0.9 of half) of
        // the last shared rate.
        let shared = fake.0.lock().unwrap().rate.unwrap();
        fake.0.lock().unwrap().up = false;
        let per = run(&pacers, 20).await;
        let total: u32 = per.iter().sum();
        let expected = shared * ALONE_SHARE * 20.0;
        assert!(
            f64::from(total) <= expected * 1.1 + 2.0 && f64::from(total) >= expected * 0.8,
            "alone, together at most the shared rate: {per:?}, shared {shared}"
        );
        assert!(pacers.iter().all(|p| p.lock().alone()));
        fake.0.lock().unwrap().up = true;
        // Answered again, each keeps its share while the other may still
        // pace alone (a retry and two intervals alone), then rejoins.
        run(&pacers, 4).await;
        assert!(pacers.iter().all(|p| !p.lock().alone()), "rejoined");
    }

    /// One replica's way to the store: cut off on its own (its own rest
    /// after a failure, its own moment of finding the store back).
    struct Via(Arc<Fake>, std::sync::atomic::AtomicBool);

    impl SharedBudget for Via {
        fn admit(&self, proposal: Proposal) -> AdmitFuture<'_> {
            if self.1.load(std::sync::atomic::Ordering::Relaxed) {
                return Box::pin(async { None });
            }
            self.0.admit(proposal)
        }

        fn report(&self, change: SharedChange) {
            self.0.report(change);
        }

        fn replicas(&self) -> u32 {
            self.0.replicas()
        }

        fn retry_every(&self) -> Duration {
            self.0.retry_every()
        }
    }

    /// Every send of the replicas, by saturating demand, for `secs`.
    async fn sends(pacers: &[Arc<PacerShared>], secs: u64) -> Vec<Instant> {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for p in pacers {
            for _ in 0..3 {
                let p = p.clone();
                tasks.push(tokio::spawn(async move {
                    let mut at = Vec::new();
                    while Instant::now() < end {
                        if let Ok(t) = p.acquire().await {
                            if t < end {
                                at.push(t);
                            }
                        }
                    }
                    at
                }));
            }
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort();
        all
    }

    /// R-DS2: the store lost and found again while every replica's demand
    /// saturates the pace — no request is sent unpaced when a call fails,
    /// the replicas going alone start at phases of their own (not all at
    /// once on top of the shared slots), and one answered again keeps its
    /// share until the other can have found the store back: in no second
    /// of the switch does the fleet send over 1.1 × the shared rate.
    #[tokio::test(start_paused = true)]
    async fn losing_and_finding_the_store_never_overruns_the_rate() {
        let fake = store_up();
        let vias: Vec<Arc<Via>> = (0..2)
            .map(|_| Arc::new(Via(fake.clone(), false.into())))
            .collect();
        let pacers: Vec<Arc<PacerShared>> = vias
            .iter()
            .enumerate()
            .map(|(i, via)| {
                let p = PacerShared::new(&ProviderSettings::with_ceiling(50.0));
                p.set_budget(Some(via.clone() as Arc<dyn SharedBudget>));
                p.seed_spread(7 + i as u64);
                p
            })
            .collect();
        let start = Instant::now();
        // Shared; then the store lost by both; found again by the first,
        // and by the second 0.9 s later (its rest after a failure).
        let cut = |i: usize, off: bool| {
            vias[i].1.store(off, std::sync::atomic::Ordering::Relaxed);
        };
        let script = {
            async {
                tokio::time::sleep(Duration::from_secs(6)).await;
                cut(0, true);
                cut(1, true);
                tokio::time::sleep(Duration::from_secs(6)).await;
                cut(0, false);
                tokio::time::sleep(Duration::from_millis(900)).await;
                cut(1, false);
            }
        };
        let (all, ()) = tokio::join!(sends(&pacers, 20), script);
        let rate = fake.0.lock().unwrap().rate.unwrap();
        let mut per_second = vec![0u32; 20];
        for t in &all {
            per_second[(*t - start).as_secs() as usize] += 1;
        }
        // The first second is the cold start's (its first slot at once).
        let worst = per_second[1..].iter().copied().max().unwrap();
        assert!(
            f64::from(worst) <= (rate * 1.1).ceil(),
            "per second {per_second:?} at the shared rate {rate}"
        );
        // And the switch costs little: at least 0.8 × the rate in each
        // second of it (the store's loss and return included).
        for (s, n) in per_second.iter().enumerate().skip(1) {
            assert!(
                f64::from(*n) >= (rate * 0.8).floor(),
                "second {s}: {per_second:?} at {rate}"
            );
        }
    }

    /// One of eight replicas with a seat: cut off with the others when
    /// `down`, and reading the store's clock (a made-up epoch, moved by
    /// tokio's clock) from its seat.
    struct Seated {
        store: Arc<Fake>,
        index: u32,
        down: Arc<std::sync::atomic::AtomicBool>,
        /// Seats below this one are cut off when `down`.
        cut: u32,
        epoch: Instant,
    }

    impl SharedBudget for Seated {
        fn admit(&self, proposal: Proposal) -> AdmitFuture<'_> {
            if self.down.load(std::sync::atomic::Ordering::Relaxed) && self.index < self.cut {
                return Box::pin(async { None });
            }
            self.store.admit(proposal)
        }

        fn report(&self, change: SharedChange) {
            self.store.report(change);
        }

        fn replicas(&self) -> u32 {
            8
        }

        fn retry_every(&self) -> Duration {
            Duration::from_secs(1)
        }

        fn recheck_after(&self) -> Duration {
            Duration::from_millis(250)
        }

        fn seat(&self) -> Option<Seat> {
            let clock = Duration::new(1_796_000_000, 123_456_789) + (Instant::now() - self.epoch);
            Some(Seat {
                index: self.index,
                clock,
            })
        }
    }

    /// R-DS2: eight replicas that lose the store together pace alone in
    /// their seats' slots of one grid on the store's clock — interleaved as
    /// the shared schedule had them: in no second (sliding, every 10 ms)
    /// do they send more than their shares' sum allows one schedule to,
    /// and together they still send that sum. At phases of their own
    /// (drawn at random) a second held up to half as many again.
    #[tokio::test(start_paused = true)]
    async fn replicas_alone_send_in_their_seats_not_at_once() {
        let fake = store_up();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let epoch = Instant::now();
        let pacers: Vec<Arc<PacerShared>> = (0..8)
            .map(|i| {
                let p = PacerShared::new(&ProviderSettings::with_ceiling(50.0));
                let seated = Seated {
                    store: fake.clone(),
                    index: i,
                    down: down.clone(),
                    cut: 8,
                    epoch,
                };
                p.set_budget(Some(Arc::new(seated) as Arc<dyn SharedBudget>));
                p
            })
            .collect();
        let start = Instant::now();
        let script = async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            down.store(true, std::sync::atomic::Ordering::Relaxed);
        };
        let (all, ()) = tokio::join!(sends(&pacers, 24), script);
        let rate = fake.0.lock().unwrap().rate.unwrap() * ALONE_SHARE;
        assert!(pacers.iter().all(|p| p.lock().alone()));
        // Alone from the first interval alone after the loss on.
        let from = start + Duration::from_secs_f64(4.0 + 8.0 / rate);
        let alone: Vec<Instant> = all.into_iter().filter(|t| *t >= from).collect();
        let most = (rate.floor() as usize) + 1;
        let mut at = from;
        while at + Duration::from_secs(1) <= start + Duration::from_secs(24) {
            let n = alone
                .iter()
                .filter(|t| **t >= at && **t < at + Duration::from_secs(1))
                .count();
            assert!(
                n <= most,
                "{n} sends in the second from {:?} (≤ {most} at {rate:.2}/s together)",
                at - start
            );
            at += Duration::from_millis(10);
        }
        let span = (start + Duration::from_secs(24) - from).as_secs_f64();
        assert!(
            alone.len() as f64 >= rate * span * 0.95,
            "{} sends alone in {span:.1} s at {rate:.2}/s together",
            alone.len()
        );
    }

    /// Sends in the busiest second (sliding, every 10 ms) of `[from, to)`.
    fn busiest_second(sends: &[Instant], from: Instant, to: Instant) -> usize {
        let mut most = 0;
        let mut at = from;
        while at + Duration::from_secs(1) <= to {
            let n = sends
                .iter()
                .filter(|t| **t >= at && **t < at + Duration::from_secs(1))
                .count();
            most = most.max(n);
            at += Duration::from_millis(10);
        }
        most
    }

    /// Eight replicas, each sending as fast as its pacer lets it for
    /// `secs` at the rate a fleet had learned, sharing one store whose
    /// seats below `cut` are cut off from `loss` for `outage`: every send,
    /// and how many replicas paced alone at some point (seen every 10 ms).
    async fn cut_off(
        cut: u32,
        loss: Duration,
        outage: Duration,
        secs: u64,
    ) -> (Vec<Instant>, usize) {
        let fake = store_up();
        fake.0.lock().unwrap().rate = Some(10.13);
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let epoch = Instant::now();
        let pacers: Vec<Arc<PacerShared>> = (0..8)
            .map(|i| {
                let p = PacerShared::new(&ProviderSettings::with_ceiling(50.0));
                let seated = Seated {
                    store: fake.clone(),
                    index: i,
                    down: down.clone(),
                    cut,
                    epoch,
                };
                p.set_budget(Some(Arc::new(seated) as Arc<dyn SharedBudget>));
                p
            })
            .collect();
        let end = Instant::now() + Duration::from_secs(secs);
        let script = async {
            let mut alone = vec![false; pacers.len()];
            let watch = |alone: &mut Vec<bool>| {
                for (a, p) in alone.iter_mut().zip(&pacers) {
                    *a |= p.lock().alone();
                }
            };
            tokio::time::sleep(loss).await;
            down.store(true, std::sync::atomic::Ordering::Relaxed);
            let back = Instant::now() + outage;
            while Instant::now() < back {
                watch(&mut alone);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            down.store(false, std::sync::atomic::Ordering::Relaxed);
            while Instant::now() < end {
                watch(&mut alone);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            alone.iter().filter(|a| **a).count()
        };
        tokio::join!(sends(&pacers, secs), script)
    }

    /// [`cut_off`] at ten phases of the loss (from 4 s on): for each, the
    /// loss, the sends (with the instant `s` seconds after the first), how
    /// many went alone, and the busiest second over 1–4 s (before) and
    /// over 3 s to the end (across the loss and the return).
    async fn cut_off_at_phases(
        cut: u32,
        outage: Duration,
        secs: u64,
    ) -> Vec<(Duration, Vec<Instant>, usize, usize, usize)> {
        let mut runs = Vec::new();
        for k in 0..10u64 {
            let loss = Duration::from_millis(4000 + 37 * k);
            let (sends, alone) = cut_off(cut, loss, outage, secs).await;
            let start = *sends.first().unwrap();
            let at = |s: f64| start + Duration::from_secs_f64(s);
            let before = busiest_second(&sends, at(1.0), at(4.0));
            let after = busiest_second(&sends, at(3.0), at(secs as f64));
            runs.push((loss, sends, alone, before, after));
        }
        runs
    }

    /// R-DS2: three of eight replicas miss the store for 150 ms (a stalled
    /// client, timeouts under load) while the others still take every
    /// shared slot. Asked again 250 ms later, the store answers: none of
    /// the three went alone, and in no second (sliding, every 10 ms) did
    /// the fleet send more than in its busiest second before. Going alone
    /// at the first miss, the three's shares came on top: 16 in a second
    /// where the schedule gave 11.
    #[tokio::test(start_paused = true)]
    async fn a_miss_of_some_replicas_own_puts_nothing_on_top_of_the_schedule() {
        for (loss, _, alone, before, after) in
            cut_off_at_phases(3, Duration::from_millis(150), 9).await
        {
            assert_eq!(alone, 0, "loss at {loss:?}");
            assert!(
                after <= before,
                "loss at {loss:?}: {after} in a second, {before} before"
            );
        }
    }

    /// R-DS2: every replica loses the store for 1.5 s (an outage: the
    /// second ask misses too) — all pace alone in their seats, then rejoin;
    /// in no second across either change does the fleet send more than
    /// in its busiest second before, and every second has sends.
    #[tokio::test(start_paused = true)]
    async fn an_outage_for_every_replica_puts_nothing_on_top_either() {
        for (loss, sends, alone, before, after) in
            cut_off_at_phases(8, Duration::from_millis(1500), 12).await
        {
            let start = *sends.first().unwrap();
            let at = |s: f64| start + Duration::from_secs_f64(s);
            assert_eq!(alone, 8, "loss at {loss:?}");
            assert!(
                after <= before,
                "loss at {loss:?}: {after} in a second, {before} before"
            );
            for s in 1..12 {
                assert!(
                    sends
                        .iter()
                        .any(|t| *t >= at(f64::from(s)) && *t < at(f64::from(s + 1))),
                    "loss at {loss:?}: nothing sent in second {s}"
                );
            }
        }
    }
}
