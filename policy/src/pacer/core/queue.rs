//! The waiting room: a request's slot, its place in the fair queue, how
//! long it may wait (R-GC2).

use super::*;

/// What a waiter should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go: the request has been admitted and its slot taken.
    Go,
    /// Wait until this instant (or until the state changes) and ask again.
    WaitUntil(Instant),
    /// Refused: its slot would come later than it may wait. Come back after
    /// the duration. The ticket has been removed.
    Refuse(Duration),
}

impl PacerCore {
    /// How many requests may wait.
    pub fn max_queue_len(&self) -> usize {
        self.settings().max_queue_len
    }

    /// The instant the request with `ahead` waiters before it would go.
    pub(super) fn slot(&self, now: Instant, ahead: u32) -> Instant {
        let mut at = self.gcra.earliest(now, ahead);
        if let Some(end) = self.rare.allowance().and_then(|a| a.spent_until(now)) {
            at = at.max(end);
        }
        match self.hold_until() {
            Some(hold) if hold > now => {
                // After the hold, waiters go one interval apart from the hold.
                at.max(hold + self.gcra.interval() * ahead)
            }
            _ => at,
        }
    }

    /// A request arrives. It either gets a ticket to wait with or is refused
    /// at once with the wait it would have had.
    pub fn enqueue(&mut self, now: Instant) -> Result<Ticket, (Refusal, Duration)> {
        self.enqueue_as(now, &Class::default(), 1.0)
    }

    /// [`PacerCore::enqueue`] for a request of `class` costing `cost`
    /// units (R-FS2): its wait is its place in the fair order (R-FS1).
    pub fn enqueue_as(
        &mut self,
        now: Instant,
        class: &Class,
        cost: f64,
    ) -> Result<Ticket, (Refusal, Duration)> {
        self.refresh_allowance(now);
        let ticket = Ticket::new(self.next_ticket);
        self.waiting.insert(ticket, class, cost);
        let wait = self
            .slot(now, self.waiting.ahead(ticket))
            .saturating_duration_since(now);
        let refusal = if self.waiting.len() > self.settings().max_queue_len {
            Some(Refusal::QueueFull)
        } else if wait > self.patience(now) {
            Some(Refusal::WaitTooLong)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.waiting.remove(ticket);
            return Err((refusal, wait));
        }
        self.next_ticket += 1;
        Ok(ticket)
    }

    /// The fast path: with nobody waiting and the slot due, a request is
    /// admitted at once, without a ticket. `false`: it must queue.
    pub fn try_admit(&mut self, now: Instant) -> bool {
        self.try_admit_units(now, 1)
    }

    /// [`PacerCore::try_admit`] for a request costing `units`: it takes as
    /// many slots, paid after it goes (R-FS2).
    pub fn try_admit_units(&mut self, now: Instant, units: u32) -> bool {
        self.refresh_allowance(now);
        if !self.waiting.is_empty() || self.slot(now, 0) > now {
            return false;
        }
        self.gcra.admit(now);
        self.gcra.charge(units.saturating_sub(1));
        self.aimd.on_admit_units(now, units.max(1));
        self.spend(now, units.max(1));
        true
    }

    /// Asks whether `ticket`, which may wait until `deadline`, may go now.
    /// Waiters are admitted strictly in arrival order (R-GC2); holds and
    /// rate changes apply to them as they stand.
    pub fn poll(&mut self, ticket: Ticket, deadline: Instant, now: Instant) -> Admission {
        let next = self.waiting.next() == Some(ticket);
        let ahead = if next {
            0
        } else {
            self.waiting.ahead(ticket).max(1)
        };
        let at = self.slot(now, ahead);
        if at > deadline {
            self.waiting.remove(ticket);
            return Admission::Refuse(at.saturating_duration_since(now));
        }
        if next && at <= now {
            let units = self.waiting.cost(ticket).unwrap_or(1.0).round().max(1.0) as u32;
            self.waiting.admitted(ticket);
            self.gcra.admit_waited(now);
            self.gcra.charge(units - 1);
            self.aimd.on_admit_units(now, units);
            self.spend(now, units);
            return Admission::Go;
        }
        Admission::WaitUntil(at)
    }

    /// The ticket that goes next.
    pub fn head(&self) -> Option<Ticket> {
        self.waiting.next()
    }

    /// A waiter left without being admitted (its client went away).
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        self.waiting.remove(ticket)
    }

    /// The queue's deadline for a request arriving at `now`.
    pub fn deadline(&self, now: Instant) -> Instant {
        now + self.patience(now)
    }

    /// How long a request may wait for its slot: `max_queue_wait`, or
    /// `max_hold_wait` while the provider holds us off — a windowed quota's
    /// reset is waited for, not refused through.
    pub fn patience(&self, now: Instant) -> Duration {
        match self.hold_until() {
            Some(h) if h > now => self
                .settings()
                .max_queue_wait
                .max(self.settings().max_hold_wait),
            _ => self.settings().max_queue_wait,
        }
    }

    /// The earliest instant a new request arriving at `now` could be sent.
    pub fn next_slot(&self, now: Instant) -> Instant {
        let ahead = u32::try_from(self.waiting.len()).unwrap_or(u32::MAX);
        self.slot(now, ahead)
    }
}
