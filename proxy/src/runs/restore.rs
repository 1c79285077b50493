//! The runs read back from the store after a restart (R-RN10): each
//! collector's fencing token, run numbers, checkpoints and stop gaps, the
//! run that was active when sluice stopped — resumed if its lease has not
//! lapsed, else ended with its gap records.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_policy::run::{Envelope, ProviderWaits, RunHandle, RunState, StopReason};
use tokio::time::Instant;

use super::lease::fence_key;
use super::records::{prefix, Checkpoint, Gap, Mode, Phase, RunRecord};
use super::{reserve_key, Active, Registry, Runs};
use crate::store::{unix_ms_now, RunTree, Store};

/// A collector's runs as the store holds them.
#[derive(Default)]
struct Stored {
    /// The newest run not resumed: what `last` shows.
    last: Option<RunRecord>,
    /// Per mode, the active run that goes on.
    resumed: BTreeMap<Mode, RunRecord>,
    /// Active runs that cannot go on, already marked interrupted, with
    /// their keys.
    interrupted: Vec<(Vec<u8>, RunRecord)>,
}

/// A big-endian `u64` as the store keeps counters, or 0.
fn stored_u64(value: Option<Vec<u8>>) -> u64 {
    value
        .and_then(|v| v.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

impl Runs {
    /// Reads back what the store holds for each collector: its fencing
    /// token, checkpoints, stop gaps, and the run that was active when
    /// sluice stopped — resumed if its lease has not lapsed, else ended
    /// with its gap records (R-RN10).
    pub(super) fn load(&self) {
        let Some(store) = &self.store else { return };
        let mut reg = self.lock();
        let names: Vec<String> = reg.slots.keys().cloned().collect();
        reg.next_seq = reg.next_seq.max(last_seq(store, &names));
        for name in names {
            let fence = stored_u64(store.get(RunTree::Meta, &fence_key(&name)));
            let now_ms = unix_ms_now();
            let stored = read_runs(store, &name, fence, now_ms);
            let pending = read_gaps(store, &mut reg, &name);
            read_checkpoints(store, &mut reg, &name);
            let max_waits = reg.max_cooldown_waits;
            if let Some(slot) = reg.slots.get_mut(&name) {
                slot.fence = fence;
                slot.last = stored.last;
                slot.pending_gaps = pending;
                for (mode, record) in stored.resumed {
                    let reserved = stored_u64(store.get(RunTree::Meta, &reserve_key(&record.id)));
                    let active = resume(record, reserved, now_ms, max_waits);
                    tracing::info!(collector = %name, run = %active.record.id, mode = mode.label(), units = active.handle.units(), "run resumed after a restart");
                    self.reserving(&active.handle, &active.record.id, active.handle.units());
                    slot.active.insert(mode, active);
                }
            }
            self.end_interrupted(&mut reg, &name, stored.interrupted);
        }
    }

    /// Runs whose lease lapsed while sluice was down: interrupted, their
    /// remainder recorded as gaps unless a stop already did.
    fn end_interrupted(
        &self,
        reg: &mut Registry,
        name: &str,
        interrupted: Vec<(Vec<u8>, RunRecord)>,
    ) {
        for (key, mut record) in interrupted {
            if record.stop_reason.is_none() && record.lease_until_unix_ms.is_some() {
                let mut streams = record.streams.clone();
                if streams.is_empty() {
                    streams.push("*".to_string());
                }
                for stream in streams {
                    let gap = self.stop_gap(
                        reg,
                        name,
                        record.mode,
                        &stream,
                        Phase::Interrupted.label(),
                        None,
                        &record.id,
                    );
                    record.gaps_recorded += u64::from(gap.is_some());
                }
            }
            self.write(RunTree::Runs, key, &record);
        }
    }
}

/// The last run or gap number handed out: numbers go on from it (or from
/// the highest stored, if the counter was lost with a crash).
fn last_seq(store: &Store, names: &[String]) -> u64 {
    let seq_of = |key: &[u8]| {
        key.len()
            .checked_sub(8)
            .and_then(|at| key[at..].try_into().ok())
            .map_or(0, u64::from_be_bytes)
    };
    let mut last = stored_u64(store.get(RunTree::Meta, super::SEQ_KEY));
    for name in names {
        for tree in [RunTree::Runs, RunTree::Gaps] {
            if let Some((key, _)) = store.scan_newest(tree, &prefix(name)).next() {
                last = last.max(seq_of(&key));
            }
        }
    }
    last
}

/// A collector's stored runs, newest first: per mode, the newest goes on
/// if it is active, its lease has not lapsed and its token is one handed
/// out (R-RN10); any other active run was interrupted.
fn read_runs(store: &Store, name: &str, fence: u64, now_ms: u64) -> Stored {
    let mut stored = Stored::default();
    let mut seen: Vec<Mode> = Vec::new();
    for (key, value) in store.scan_newest(RunTree::Runs, &prefix(name)) {
        let Ok(mut record) = serde_json::from_slice::<RunRecord>(&value) else {
            continue;
        };
        let newest_of_mode = !seen.contains(&record.mode);
        seen.push(record.mode);
        if record.phase == Phase::Active {
            let alive = record.lease_until_unix_ms.is_some_and(|l| l > now_ms);
            if alive && newest_of_mode && record.fencing_token <= fence {
                stored.resumed.insert(record.mode, record);
                continue;
            }
            record.phase = Phase::Interrupted;
            record.ended_unix_ms = Some(now_ms);
            stored.interrupted.push((key, record.clone()));
        }
        if stored.last.is_none() {
            stored.last = Some(record);
        }
    }
    stored
}

/// Indexes a collector's stop gaps (the newest per mode, stream and
/// provider) and returns how many gaps are pending.
fn read_gaps(store: &Store, reg: &mut Registry, name: &str) -> u64 {
    let mut pending = 0;
    for (_, value) in store.scan(RunTree::Gaps, &prefix(name), &[]) {
        pending += 1;
        let Ok(gap) = serde_json::from_slice::<Gap>(&value) else {
            continue;
        };
        if let (true, Some(mode)) = (gap.stop, gap.mode) {
            // Scanned oldest first: the newest stays indexed.
            let key = (
                name.to_string(),
                mode,
                gap.stream.clone(),
                gap.provider.clone(),
            );
            reg.stop_gaps.insert(key, gap);
        }
    }
    pending
}

/// A collector's committed checkpoints, per mode and stream.
fn read_checkpoints(store: &Store, reg: &mut Registry, name: &str) {
    for (key, value) in store.scan(RunTree::Checkpoints, &prefix(name), &[]) {
        let rest = &key[name.len() + 1..];
        let Some(split) = rest.iter().position(|&b| b == 0) else {
            continue;
        };
        let mode = std::str::from_utf8(&rest[..split])
            .ok()
            .and_then(Mode::parse);
        let stream = String::from_utf8(rest[split + 1..].to_vec()).ok();
        let checkpoint = serde_json::from_slice::<Checkpoint>(&value).ok();
        if let (Some(mode), Some(stream), Some(c)) = (mode, stream, checkpoint) {
            reg.checkpoints.insert((name.to_string(), mode, stream), c);
        }
    }
}

/// An active run read back from the store (R-RN10): its budgets, its
/// attempts counted from the reservation (never fewer than were made), its
/// stops, and the rest of its lease.
fn resume(record: RunRecord, reserved: u64, now_ms: u64, max_cooldown_waits: u32) -> Active {
    let now = Instant::now();
    let at = |unix_ms: u64| now + Duration::from_millis(unix_ms.saturating_sub(now_ms));
    let deadline = record
        .deadline_s
        .map(|s| at(record.started_unix_ms + (s * 1000.0) as u64));
    let reason = |label: &str| StopReason::ALL.into_iter().find(|r| r.label() == label);
    // Charged: the durable reservation (every attempt that left is within
    // it; at most a block more, R-RN10) — not the counters last written,
    // which held attempts still waiting for a slot.
    let units = record.attempts_reserved.max(reserved);
    let attempts = record.attempts + units.saturating_sub(record.units);
    let mut state = RunState::new(Envelope {
        request_cap: record.request_cap,
        deadline,
        retry_budget: None,
        retry_ratio: record.retry_ratio,
        max_cooldown_waits,
    });
    state.attempts = attempts;
    state.units = units;
    state.departed = units;
    state.retries = record.retries;
    state.waits_total = record.cooldown_waits;
    state.stopped = record.stop_reason.as_deref().and_then(reason);
    for (provider, p) in &record.providers {
        state.providers.insert(
            provider.clone(),
            ProviderWaits {
                attempts: p.attempts,
                waits: p.waits,
                stopped: p.stopped.as_deref().and_then(reason),
                ..ProviderWaits::default()
            },
        );
    }
    for (provider, r) in &record.provider_stops {
        state.providers.entry(provider.clone()).or_default().stopped = reason(r);
    }
    let lease_ms = record.lease_until_unix_ms.unwrap_or(now_ms);
    Active {
        settled: record.stop_reason.is_some(),
        settled_providers: record.provider_stops.keys().cloned().collect(),
        streams: record.streams.iter().cloned().collect(),
        handle: RunHandle::resume(state),
        lease_until: at(lease_ms),
        counted: attempts,
        lease_written_ms: lease_ms,
        record,
    }
}
