//! A sliding window of counts per slot of time, kept sparse: only the
//! slots that counted something, each beside its index.
//!
//! The breaker's window and the retry budget are `N` slots of counts. Kept
//! as an array they were 120 bytes each of every tracked provider, however
//! little it was used; a host a broad crawl asks once fills one slot
//! (R-PF1, issue 38). A provider in steady use has its `N` slots here, in
//! one allocation that changes size once a slot of time.

/// Counts per slot of time over the last `N` slots: the slots that
/// counted something, oldest first, each with its index's low 32 bits
/// (every slot kept lies within `N` of the newest, whose whole index is
/// kept: no two of them share their low bits).
#[derive(Debug, Clone)]
pub(crate) struct Window<C, const N: u32> {
    /// The newest slot counted.
    newest: u64,
    slots: Box<[(u32, C)]>,
}

impl<C, const N: u32> Default for Window<C, N> {
    fn default() -> Self {
        Window {
            newest: 0,
            slots: Box::default(),
        }
    }
}

impl<C: Copy + Default, const N: u32> Window<C, N> {
    /// The whole index of a slot kept (within `N` of the newest).
    fn index_of(&self, low: u32) -> u64 {
        self.newest - u64::from((self.newest as u32).wrapping_sub(low))
    }

    /// The counts of slot `index`, made at zero if new — the slots it
    /// moves the window past let go — or `None` for a slot the window has
    /// already passed (a clock read long before the newest count).
    pub(crate) fn at(&mut self, index: u64) -> Option<&mut C> {
        if self.slots.is_empty() {
            self.newest = index;
            self.slots = Box::new([(index as u32, C::default())]);
            return self.slots.last_mut().map(|(_, c)| c);
        }
        if index == self.newest {
            // The common case: the newest slot again, no change of size.
            return self.slots.last_mut().map(|(_, c)| c);
        }
        if index < self.newest && self.newest - index >= u64::from(N) {
            return None;
        }
        let mut slots = std::mem::take(&mut self.slots).into_vec();
        let at = if index < self.newest {
            // Before the newest (another thread's earlier clock read): its
            // place among the slots.
            let at = slots
                .iter()
                .position(|(i, _)| self.index_of(*i) >= index)
                .unwrap_or(slots.len());
            if slots
                .get(at)
                .is_none_or(|(i, _)| self.index_of(*i) != index)
            {
                slots.reserve_exact(1);
                slots.insert(at, (index as u32, C::default()));
            }
            at
        } else {
            // The window moves on: the slots it passed are let go.
            slots.retain(|(i, _)| index - self.index_of(*i) < u64::from(N));
            slots.reserve_exact(1);
            slots.push((index as u32, C::default()));
            self.newest = index;
            slots.len() - 1
        };
        // Exactly as long as its slots (16 bytes, not a vector's 24).
        self.slots = slots.into_boxed_slice();
        self.slots.get_mut(at).map(|(_, c)| c)
    }

    /// The counts of the slots in the window that ends with slot `index`.
    pub(crate) fn live(&self, index: u64) -> impl Iterator<Item = &C> {
        self.slots
            .iter()
            .filter(move |(i, _)| {
                let slot = self.index_of(*i);
                slot <= index && index - slot < u64::from(N)
            })
            .map(|(_, c)| c)
    }

    /// The newest slot counted, if any.
    #[cfg(test)]
    pub(crate) fn newest(&self) -> Option<u64> {
        (!self.slots.is_empty()).then_some(self.newest)
    }

    /// Empties the window.
    pub(crate) fn clear(&mut self) {
        self.slots = Box::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The window's counts are those of its last `N` slots, as a list
        /// of every count says — across gaps longer than the window, many
        /// counts in one slot, slots a little before the newest (another
        /// thread's clock read), and indices past 2³² — and it holds no
        /// more slots than `N`.
        #[test]
        fn the_window_counts_its_last_slots(
            start in prop_oneof![Just(0u64), Just(u64::from(u32::MAX) - 20), Just(7u64 << 40)],
            steps in proptest::collection::vec((0u64..40, 0u64..15, any::<bool>()), 1..300)
        ) {
            let mut w: Window<u32, 10> = Window::default();
            let mut newest = start;
            *w.at(start).unwrap() += 1;
            let mut seen: Vec<u64> = vec![start];
            for (ahead, earlier, back) in steps {
                let index = if back { newest.saturating_sub(earlier) } else { newest + if ahead < 30 { ahead % 4 } else { ahead << 31 } };
                newest = newest.max(index);
                let counted = match w.at(index) {
                    Some(c) => {
                        *c += 1;
                        seen.push(index);
                        true
                    }
                    None => false,
                };
                prop_assert_eq!(counted, newest - index < 10);
                let live = |s: &u64| *s <= newest && newest - *s < 10;
                let want = seen.iter().filter(|s| live(s)).count() as u32;
                prop_assert_eq!(w.live(newest).sum::<u32>(), want);
                prop_assert!(w.slots.len() <= 10);
            }
        }
    }

    #[test]
    fn one_count_is_one_slot_and_an_emptied_window_holds_none() {
        let mut w: Window<u32, 10> = Window::default();
        *w.at(7).unwrap() += 1;
        assert_eq!(w.slots.len(), 1);
        assert_eq!(w.live(16).sum::<u32>(), 1);
        assert_eq!(w.live(17).sum::<u32>(), 0, "ten slots on, it has passed");
        w.clear();
        assert_eq!(w.newest(), None);
    }
}
