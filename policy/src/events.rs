//! What happened inside a provider's stack, for the caller to count.
//!
//! The policy crate does no I/O, so it does not own metrics or logs; it
//! reports events through one sink per provider, and the proxy turns them
//! into Prometheus series and log lines. Breaker transitions have their own
//! method ([`crate::breaker::TransitionObserver`]) because they are also
//! durable evidence; one [`Observer`] a provider takes both. Events carry
//! no request data — only numbers and fixed labels.

use std::sync::Arc;
use std::time::Duration;

use crate::breaker::{Transition, TransitionObserver, TransitionSink};
use crate::classify::Outcome;
use crate::pacer::{Backoff, Refusal};
use crate::quota::Family;

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An attempt was sent upstream and came back (`outcome`) — or failed
    /// without an answer the provider is responsible for (`None`).
    Attempt {
        /// What it came back with.
        outcome: Option<Outcome>,
        /// Time to the response head, when there was one.
        ttfb: Option<Duration>,
    },
    /// A request got its pacing slot after waiting this long.
    PacingWait(Duration),
    /// A request of this fair-share class (a collector's name; empty for
    /// the default class) was admitted, costing `units`, after `wait`
    /// (R-FS1).
    Admitted {
        /// The class.
        class: Arc<str>,
        /// What it cost.
        units: u32,
        /// How long it waited.
        wait: Duration,
    },
    /// The pacer refused a request.
    Shed(Refusal),
    /// A provider's `Retry-After` set or lengthened the hold.
    Hold(Duration),
    /// The rate was cut.
    Backoff(Backoff),
    /// A retry was scheduled after this outcome.
    Retry(Outcome),
    /// An answer's quota headers of this family could not be read.
    QuotaMalformed(Family),
    /// The controller found the provider's failures to be an outage
    /// (`true`), or the outage ended with a clean answer and the rate from
    /// before it was given back (`false`) (R-SG4).
    Outage(bool),
}

/// What takes a provider's events: a closure, or a value that takes its
/// breaker's transitions too ([`crate::breaker::TransitionObserver`]) —
/// one allocation a provider, where two closures each kept a copy of its
/// names (R-PF1, issue 38).
pub trait EventObserver: Send + Sync {
    /// Takes one event.
    fn event(&self, event: &Event);
}

impl<F: Fn(&Event) + Send + Sync> EventObserver for F {
    fn event(&self, event: &Event) {
        self(event);
    }
}

/// Where a provider's events go.
pub type EventSink = Arc<dyn EventObserver>;

/// What takes all of a provider's reports, its events and its breaker's
/// transitions: one pointer a provider, kept by its pacer and read by the
/// other parts through the policy, where each part kept one of its own
/// (R-PF1, issue 38). The proxy's sink is one; [`Observers`] makes one of
/// two closures.
pub trait Observer: EventObserver + TransitionObserver {}

impl<T: EventObserver + TransitionObserver + ?Sized> Observer for T {}

/// Where all of a provider's reports go.
pub type ObserverSink = Arc<dyn Observer>;

/// Separate sinks for events and transitions, as one [`Observer`] (either
/// may be left out).
#[derive(Default)]
pub struct Observers {
    /// Where events go.
    pub events: Option<EventSink>,
    /// Where breaker transitions go.
    pub transitions: Option<TransitionSink>,
}

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observers")
            .field("events", &self.events.is_some())
            .field("transitions", &self.transitions.is_some())
            .finish()
    }
}

impl Observers {
    /// The two, as a provider's observer.
    pub fn sink(self) -> ObserverSink {
        Arc::new(self)
    }

    /// An observer of events alone.
    pub fn of_events(events: impl EventObserver + 'static) -> ObserverSink {
        Observers {
            events: Some(Arc::new(events)),
            transitions: None,
        }
        .sink()
    }

    /// An observer of breaker transitions alone.
    pub fn of_transitions(transitions: impl TransitionObserver + 'static) -> ObserverSink {
        Observers {
            events: None,
            transitions: Some(Arc::new(transitions)),
        }
        .sink()
    }
}

impl EventObserver for Observers {
    fn event(&self, event: &Event) {
        if let Some(e) = &self.events {
            e.event(event);
        }
    }
}

impl TransitionObserver for Observers {
    fn transition(&self, transition: &Transition) {
        if let Some(t) = &self.transitions {
            t.transition(transition);
        }
    }
}

/// Sends `event` to `sink`, if there is one.
pub(crate) fn emit(sink: Option<&dyn Observer>, event: Event) {
    if let Some(sink) = sink {
        sink.event(&event);
    }
}
