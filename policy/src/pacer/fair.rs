//! Who goes next when several collectors wait for one provider (R-FS1):
//! weighted fair shares between collectors, steady before catch-up within
//! one; each request weighs its cost in units (R-FS2; 1 until costs are
//! configured).
//!
//! The pacer decides *when* the next request may go; this decides *which*
//! waiting request it is. Between collectors it is start-time fair queuing
//! (SFQ, Goyal et al. 1996): each collector's next request carries a
//! virtual start tag, `max(V, the collector's last finish)`, and the
//! smallest goes; serving it moves the collector's finish on by
//! `cost / weight` and the virtual time `V` to its start. Collectors that
//! all keep requests waiting are served in proportion to their weights; an
//! idle collector's share flows to the others at once (work-conserving),
//! and one that comes back starts at `V` — it banks no credit while idle.
//!
//! Within a collector, a `steady` run's requests go before a `catchup`
//! run's: backfills must not starve the run that keeps data fresh. The
//! catch-up lane keeps a floor — a share of what the collector is admitted
//! while both lanes wait — so it never starves either.
//!
//! With one class and one lane (every request the default class's, as
//! without collectors) this is the plain FIFO it replaces.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

pub use crate::attempt::{Class, Lane, CATCHUP_FLOOR};

/// A place in the waiting room: tickets are handed out in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

impl Ticket {
    /// The `n`th ticket.
    pub(super) const fn new(n: u64) -> Ticket {
        Ticket(n)
    }
}

/// How much of a lane's past admissions each new one keeps: the floor is
/// kept over roughly the last hundred admissions, not since the start.
const LANE_MEMORY: f64 = 0.99;

#[derive(Debug)]
struct Waiter {
    class: Arc<str>,
    lane: Lane,
    cost: f64,
}

#[derive(Debug)]
struct ClassQueue {
    weight: f64,
    catchup_floor: f64,
    /// The virtual time its last admitted request finished at.
    finish: f64,
    steady: BTreeSet<Ticket>,
    catchup: BTreeSet<Ticket>,
    /// Recent admissions of each lane (decayed), for the floor.
    steady_served: f64,
    catchup_served: f64,
}

impl ClassQueue {
    fn is_empty(&self) -> bool {
        self.steady.is_empty() && self.catchup.is_empty()
    }

    /// The lane whose request goes next, if any waits.
    fn next_lane(&self) -> Option<Lane> {
        match (self.steady.is_empty(), self.catchup.is_empty()) {
            (true, true) => None,
            (false, true) => Some(Lane::Steady),
            (true, false) => Some(Lane::Catchup),
            (false, false) => {
                // Catch-up goes when a steady admission now would leave it
                // under its floor: the floor holds after every admission,
                // not just on average (a unit's look-ahead).
                let served = (self.steady_served + self.catchup_served) * LANE_MEMORY;
                let catchup = self.catchup_served * LANE_MEMORY;
                if catchup < self.catchup_floor * (served + 1.0) {
                    Some(Lane::Catchup)
                } else {
                    Some(Lane::Steady)
                }
            }
        }
    }

    fn lane(&self, lane: Lane) -> &BTreeSet<Ticket> {
        match lane {
            Lane::Steady => &self.steady,
            Lane::Catchup => &self.catchup,
        }
    }

    fn lane_mut(&mut self, lane: Lane) -> &mut BTreeSet<Ticket> {
        match lane {
            Lane::Steady => &mut self.steady,
            Lane::Catchup => &mut self.catchup,
        }
    }

    /// This lane's share of the collector's admissions while both wait.
    fn lane_share(&self, lane: Lane) -> f64 {
        let other = match lane {
            Lane::Steady => &self.catchup,
            Lane::Catchup => &self.steady,
        };
        if other.is_empty() {
            return 1.0;
        }
        match lane {
            Lane::Steady => 1.0 - self.catchup_floor,
            Lane::Catchup => self.catchup_floor,
        }
        .max(0.01)
    }
}

/// The waiting room's order: weighted fair between classes, steady before
/// catch-up within one. Made when the first request waits and let go when
/// the last leaves: most providers never queue, and the room is 80 bytes
/// of each (issue 38, R-PF1). Nothing is lost with it: once no one waits,
/// no class is left, and the virtual time only orders classes.
#[derive(Debug, Default)]
pub struct FairQueue {
    room: Option<Box<Room>>,
}

impl FairQueue {
    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.room.as_ref().map_or(0, |r| r.len())
    }

    /// Nobody waits.
    pub fn is_empty(&self) -> bool {
        self.room.is_none()
    }

    /// Requests waiting per class (collector; "" for the default class).
    pub fn waiting_by_class(&self) -> impl Iterator<Item = (&str, usize)> {
        self.room.iter().flat_map(|r| r.waiting_by_class())
    }

    /// `ticket` waits, as `class`, costing `cost` units.
    pub fn insert(&mut self, ticket: Ticket, class: &Class, cost: f64) {
        self.room
            .get_or_insert_with(Box::default)
            .insert(ticket, class, cost);
    }

    /// `ticket` leaves without being admitted.
    pub fn remove(&mut self, ticket: Ticket) -> bool {
        let removed = self.room.as_mut().is_some_and(|r| r.remove(ticket));
        self.let_go_if_empty();
        removed
    }

    /// The request that goes next (see [`Room::next`]).
    pub fn next(&self) -> Option<Ticket> {
        self.room.as_ref()?.next()
    }

    /// `ticket` was admitted (see [`Room::admitted`]).
    pub fn admitted(&mut self, ticket: Ticket) {
        if let Some(r) = self.room.as_mut() {
            r.admitted(ticket);
        }
        self.let_go_if_empty();
    }

    /// What `ticket` costs, if it waits.
    pub fn cost(&self, ticket: Ticket) -> Option<f64> {
        self.room.as_ref()?.cost(ticket)
    }

    /// About how many slots (units) go before `ticket` (see
    /// [`Room::ahead`]).
    pub fn ahead(&self, ticket: Ticket) -> u32 {
        self.room.as_ref().map_or(0, |r| r.ahead(ticket))
    }

    fn let_go_if_empty(&mut self) {
        if self.room.as_ref().is_some_and(|r| r.is_empty()) {
            self.room = None;
        }
    }
}

/// The waiting room while anyone waits.
#[derive(Debug, Default)]
struct Room {
    waiting: BTreeMap<Ticket, Waiter>,
    classes: HashMap<Arc<str>, ClassQueue>,
    /// SFQ's virtual time: the start tag of the last request admitted.
    virtual_time: f64,
}

impl Room {
    /// Requests waiting.
    fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Nobody waits.
    fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Requests waiting per class (collector; "" for the default class).
    fn waiting_by_class(&self) -> impl Iterator<Item = (&str, usize)> {
        self.classes
            .iter()
            .map(|(name, q)| (&**name, q.steady.len() + q.catchup.len()))
    }

    /// `ticket` waits, as `class`, costing `cost` units.
    fn insert(&mut self, ticket: Ticket, class: &Class, cost: f64) {
        let q = self
            .classes
            .entry(class.name.clone())
            .or_insert_with(|| ClassQueue {
                weight: class.weight,
                catchup_floor: class.catchup_floor,
                finish: 0.0,
                steady: BTreeSet::new(),
                catchup: BTreeSet::new(),
                steady_served: 0.0,
                catchup_served: 0.0,
            });
        // The latest word on the collector's weight and floor (a reload).
        q.weight = class.weight.max(f64::MIN_POSITIVE);
        q.catchup_floor = class.catchup_floor.clamp(0.0, 1.0);
        q.lane_mut(class.lane).insert(ticket);
        self.waiting.insert(
            ticket,
            Waiter {
                class: class.name.clone(),
                lane: class.lane,
                cost: cost.max(0.0),
            },
        );
    }

    /// `ticket` leaves without being admitted.
    fn remove(&mut self, ticket: Ticket) -> bool {
        let Some(w) = self.waiting.remove(&ticket) else {
            return false;
        };
        if let Some(q) = self.classes.get_mut(&w.class) {
            q.lane_mut(w.lane).remove(&ticket);
            if q.is_empty() {
                self.classes.remove(&w.class);
            }
        }
        true
    }

    /// The request that goes next: of the class with the smallest start
    /// tag (ties to the longest waiting), its lane's first.
    fn next(&self) -> Option<Ticket> {
        self.classes
            .values()
            .filter_map(|q| {
                let lane = q.next_lane()?;
                let first = *q.lane(lane).first()?;
                Some((self.virtual_time.max(q.finish), first))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, t)| t)
    }

    /// `ticket` was admitted: its class's finish and the virtual time move
    /// on, and its lane is credited.
    fn admitted(&mut self, ticket: Ticket) {
        let Some(w) = self.waiting.remove(&ticket) else {
            return;
        };
        let Some(q) = self.classes.get_mut(&w.class) else {
            return;
        };
        q.lane_mut(w.lane).remove(&ticket);
        let start = self.virtual_time.max(q.finish);
        q.finish = start + w.cost / q.weight;
        self.virtual_time = start;
        q.steady_served *= LANE_MEMORY;
        q.catchup_served *= LANE_MEMORY;
        match w.lane {
            Lane::Steady => q.steady_served += w.cost,
            Lane::Catchup => q.catchup_served += w.cost,
        }
        if q.is_empty() {
            self.classes.remove(&w.class);
        }
    }

    /// What `ticket` costs, if it waits.
    fn cost(&self, ticket: Ticket) -> Option<f64> {
        self.waiting.get(&ticket).map(|w| w.cost)
    }

    /// About how many slots (units) go before `ticket`: the units ahead of
    /// it in its lane, stretched by its lane's and its class's shares of
    /// the slots while the others wait. Exact for one class in one lane
    /// (FIFO).
    fn ahead(&self, ticket: Ticket) -> u32 {
        let Some(w) = self.waiting.get(&ticket) else {
            return 0;
        };
        let Some(q) = self.classes.get(&w.class) else {
            return 0;
        };
        let place: f64 = q
            .lane(w.lane)
            .range(..ticket)
            .filter_map(|t| self.waiting.get(t))
            .map(|w| w.cost)
            .sum();
        let total: f64 = self.classes.values().map(|c| c.weight).sum();
        let share = q.weight / total * q.lane_share(w.lane);
        let ahead = (place / share).floor();
        if ahead >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            ahead as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, weight: f64, lane: Lane) -> Class {
        Class {
            name: Arc::from(name),
            weight,
            catchup_floor: CATCHUP_FLOOR,
            lane,
        }
    }

    /// Admits `n` in the queue's order, refilling each class's lane so that
    /// it stays saturated; counts admissions per (class, lane).
    fn serve(
        q: &mut FairQueue,
        next: &mut u64,
        classes: &[Class],
        n: usize,
    ) -> HashMap<(String, Lane), usize> {
        let mut got = HashMap::new();
        for _ in 0..n {
            let t = q.next().unwrap();
            let w = &q.room.as_ref().unwrap().waiting[&t];
            *got.entry((w.class.to_string(), w.lane)).or_default() += 1;
            let c = classes
                .iter()
                .find(|c| *c.name == *w.class && c.lane == w.lane)
                .unwrap()
                .clone();
            q.admitted(t);
            q.insert(Ticket::new(*next), &c, 1.0);
            *next += 1;
        }
        got
    }

    fn fill(q: &mut FairQueue, next: &mut u64, c: &Class, n: usize) {
        for _ in 0..n {
            q.insert(Ticket::new(*next), c, 1.0);
            *next += 1;
        }
    }

    /// R-FS1: two saturating collectors with weights 3 and 1 are admitted
    /// 3:1; one class alone is FIFO.
    #[test]
    fn saturating_collectors_share_by_weight() {
        let (a, b) = (class("a", 3.0, Lane::Steady), class("b", 1.0, Lane::Steady));
        let mut q = FairQueue::default();
        let mut next = 0;
        fill(&mut q, &mut next, &b, 16);
        fill(&mut q, &mut next, &a, 16);
        let got = serve(&mut q, &mut next, &[a.clone(), b.clone()], 400);
        assert_eq!(got[&("a".to_string(), Lane::Steady)], 300, "{got:?}");
        assert_eq!(got[&("b".to_string(), Lane::Steady)], 100, "{got:?}");

        let mut fifo = FairQueue::default();
        for i in 0..5 {
            fifo.insert(Ticket::new(i), &Class::default(), 1.0);
        }
        for i in 0..5 {
            assert_eq!(fifo.next(), Some(Ticket::new(i)));
            assert_eq!(fifo.ahead(Ticket::new(4)), (4 - i) as u32);
            fifo.admitted(Ticket::new(i));
        }
        assert!(fifo.is_empty());
    }

    /// R-FS1: work-conserving, no banked credit — a collector idle for a
    /// while comes back at its share, not with a burst of catch-up.
    #[test]
    fn an_idle_collector_banks_no_credit() {
        let (a, b) = (class("a", 1.0, Lane::Steady), class("b", 1.0, Lane::Steady));
        let mut q = FairQueue::default();
        let mut next = 0;
        fill(&mut q, &mut next, &a, 8);
        // `a` alone for 500 admissions.
        serve(&mut q, &mut next, std::slice::from_ref(&a), 500);
        fill(&mut q, &mut next, &b, 8);
        let got = serve(&mut q, &mut next, &[a.clone(), b.clone()], 100);
        let (ga, gb) = (
            got[&("a".to_string(), Lane::Steady)],
            got[&("b".to_string(), Lane::Steady)],
        );
        assert!(ga.abs_diff(gb) <= 2, "{got:?}");
    }

    /// R-FS1: within a collector, a steady request goes before the
    /// catch-up backlog, while catch-up keeps its floor.
    #[test]
    fn steady_goes_first_and_catchup_keeps_its_floor() {
        let steady = class("a", 1.0, Lane::Steady);
        let catchup = class("a", 1.0, Lane::Catchup);
        let mut q = FairQueue::default();
        let mut next = 0;
        fill(&mut q, &mut next, &catchup, 64);
        fill(&mut q, &mut next, &steady, 1);
        let late = Ticket::new(next - 1);
        // Both lanes have waited; the steady one is second at most (the
        // floor may be owed first).
        let first = q.next().unwrap();
        if first != late {
            q.admitted(first);
        }
        assert_eq!(q.next(), Some(late));
        q.admitted(late);
        // Saturated both: catch-up gets its floor, no more — over any
        // stretch of a hundred admissions, not just on the whole.
        fill(&mut q, &mut next, &steady, 2);
        for _ in 0..10 {
            let got = serve(&mut q, &mut next, &[steady.clone(), catchup.clone()], 100);
            let c = got[&("a".to_string(), Lane::Catchup)];
            assert!((10..=12).contains(&c), "{got:?}");
        }
    }

    /// The estimate of what goes before a request follows the shares: a
    /// weight-1 collector's third request waits about 3 × (4 / 1) slots
    /// beside a weight-3 one.
    #[test]
    fn the_wait_estimate_follows_the_shares() {
        let (a, b) = (class("a", 3.0, Lane::Steady), class("b", 1.0, Lane::Steady));
        let mut q = FairQueue::default();
        let mut next = 0;
        fill(&mut q, &mut next, &a, 10);
        fill(&mut q, &mut next, &b, 3);
        assert_eq!(q.ahead(Ticket::new(12)), 8);
        assert_eq!(q.ahead(Ticket::new(3)), 4);
        assert!(q.remove(Ticket::new(12)));
        assert!(!q.remove(Ticket::new(12)));
        assert_eq!(q.len(), 12);
    }
}
