//! A run's life (R-RN1, R-RN2, R-RN10): opening it under a fenced lease,
//! heartbeats, finishing, the sweep that ends lapsed leases and passed
//! deadlines, attaching a collector's requests to its run, and the runs
//! read back from the store after a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_policy::error::{Cause, Fault};
use sluice_policy::run::{Envelope, ProviderWaits, RunHandle, RunState, StopReason};
use tokio::time::Instant;

use super::records::{prefix, seq_key, split_id, Checkpoint, Gap, Mode, Phase, RunRecord};
use super::{ms_from, reserve_key, Active, Answer, Opening, Registry, RunError, RunView, Runs};
use crate::store::{unix_ms_now, RunTree};

impl Runs {
    /// Reads back what the store holds for each collector: its fencing
    /// token, checkpoints, stop gaps, and the run that was active when
    /// sluice stopped — resumed if its lease has not lapsed, else ended
    /// with its gap records (R-RN10).
    pub(super) fn load(&self) {
        let Some(store) = &self.store else { return };
        let mut reg = self.lock();
        let names: Vec<String> = reg.slots.keys().cloned().collect();
        // Numbers go on from the last handed out (or the highest stored, if
        // that was lost with a crash).
        let seq_of = |key: &[u8]| {
            key.len()
                .checked_sub(8)
                .and_then(|at| key[at..].try_into().ok())
                .map_or(0, u64::from_be_bytes)
        };
        let mut last_seq = store
            .get(RunTree::Meta, super::SEQ_KEY)
            .and_then(|v| v.try_into().ok())
            .map_or(0, u64::from_be_bytes);
        for name in &names {
            for tree in [RunTree::Runs, RunTree::Gaps] {
                if let Some((key, _)) = store.scan_newest(tree, &prefix(name)).next() {
                    last_seq = last_seq.max(seq_of(&key));
                }
            }
        }
        reg.next_seq = reg.next_seq.max(last_seq);
        for name in names {
            let fence = store
                .get(RunTree::Meta, &fence_key(&name))
                .and_then(|v| v.try_into().ok())
                .map_or(0, u64::from_be_bytes);
            let mut last = None;
            let mut resumed: BTreeMap<Mode, RunRecord> = BTreeMap::new();
            let mut seen: Vec<Mode> = Vec::new();
            let mut interrupted = Vec::new();
            let now_ms = unix_ms_now();
            for (key, value) in store.scan_newest(RunTree::Runs, &prefix(&name)) {
                let Ok(mut record) = serde_json::from_slice::<RunRecord>(&value) else {
                    continue;
                };
                let newest_of_mode = !seen.contains(&record.mode);
                seen.push(record.mode);
                if record.phase == Phase::Active {
                    // Per mode, the newest run goes on if it is active, its
                    // lease has not lapsed and its token is one handed out
                    // (R-RN10); any other active run was interrupted.
                    let alive = record.lease_until_unix_ms.is_some_and(|l| l > now_ms);
                    if alive && newest_of_mode && record.fencing_token <= fence {
                        resumed.insert(record.mode, record);
                        continue;
                    }
                    record.phase = Phase::Interrupted;
                    record.ended_unix_ms = Some(now_ms);
                    interrupted.push((key, record.clone()));
                }
                if last.is_none() {
                    last = Some(record);
                }
            }
            let mut pending = 0;
            for (_, value) in store.scan(RunTree::Gaps, &prefix(&name), &[]) {
                pending += 1;
                let Ok(gap) = serde_json::from_slice::<Gap>(&value) else {
                    continue;
                };
                if let (true, Some(mode)) = (gap.stop, gap.mode) {
                    // Scanned oldest first: the newest stays indexed.
                    let key = (name.clone(), mode, gap.stream.clone(), gap.provider.clone());
                    reg.stop_gaps.insert(key, gap);
                }
            }
            for (key, value) in store.scan(RunTree::Checkpoints, &prefix(&name), &[]) {
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
                    reg.checkpoints.insert((name.clone(), mode, stream), c);
                }
            }
            let max_waits = reg.max_cooldown_waits;
            if let Some(slot) = reg.slots.get_mut(&name) {
                slot.fence = fence;
                slot.last = last;
                slot.pending_gaps = pending;
                for (mode, record) in resumed {
                    let reserved = store
                        .get(RunTree::Meta, &reserve_key(&record.id))
                        .and_then(|v| v.try_into().ok())
                        .map_or(0, u64::from_be_bytes);
                    let active = resume(record, reserved, now_ms, max_waits);
                    tracing::info!(collector = %name, run = %active.record.id, mode = mode.label(), units = active.handle.units(), "run resumed after a restart");
                    self.reserving(&active.handle, &active.record.id, active.handle.units());
                    slot.active.insert(mode, active);
                }
            }
            // Runs whose lease lapsed while sluice was down: interrupted,
            // their remainder recorded as gaps unless a stop already did.
            for (key, mut record) in interrupted {
                if record.stop_reason.is_none() && record.lease_until_unix_ms.is_some() {
                    let mut streams = record.streams.clone();
                    if streams.is_empty() {
                        streams.push("*".to_string());
                    }
                    for stream in streams {
                        let gap = self.stop_gap(
                            &mut reg,
                            &name,
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

    /// Ends runs whose lease lapsed and stops runs whose deadline passed
    /// (writing their gap records). Called before every operation and by
    /// the process's sweep.
    pub fn sweep(&self, now: Instant) {
        let mut reg = self.lock();
        let lanes: Vec<(String, Mode)> = reg
            .slots
            .iter()
            .flat_map(|(name, slot)| slot.active.keys().map(|m| (name.clone(), *m)))
            .collect();
        for (name, mode) in lanes {
            self.settle(&mut reg, &name, mode);
            let lapsed = reg.slots[&name]
                .active
                .get(&mode)
                .is_some_and(|a| a.lease_until <= now);
            if lapsed {
                self.end(&mut reg, &name, mode, Phase::Expired);
            }
        }
    }

    /// Ends `name`'s active run of `mode` with `phase`, releasing its
    /// lease.
    pub(super) fn end(
        &self,
        reg: &mut Registry,
        name: &str,
        mode: Mode,
        phase: Phase,
    ) -> Option<RunRecord> {
        // A run that ends without a stop — its lease lapsed — leaves its
        // remainder as gap records like any stop (R-RN10).
        let unsettled = reg
            .slots
            .get(name)
            .and_then(|s| s.active.get(&mode))
            .is_some_and(|a| !a.settled && a.handle.stopped().is_none());
        if unsettled && matches!(phase, Phase::Expired | Phase::Interrupted) {
            self.write_gaps(reg, name, mode, phase.label(), None);
        }
        self.finalize_stop_gaps(reg, name, mode);
        let slot = reg.slots.get_mut(name)?;
        let mut active = slot.active.remove(&mode)?;
        self.count_attempts(name, &mut active);
        let mut record = active.snapshot();
        if let Some(m) = &self.metrics {
            let reason = record.stop_reason.as_deref().unwrap_or("none");
            m.runs.with_label_values(&[name, reason]).inc();
        }
        record.phase = phase;
        record.ended_unix_ms = Some(unix_ms_now());
        slot.last = Some(record.clone());
        if let Some((_, seq)) = split_id(&record.id) {
            self.write(RunTree::Runs, seq_key(name, seq), &record);
        }
        if let Some(w) = &self.writer {
            // Ended: its reservation is in the record, and never read again.
            w.remove(RunTree::Meta, reserve_key(&record.id));
        }
        if self.store.is_none() {
            reg.ended.insert(record.id.clone(), record.clone());
        }
        self.released.notify_waiters();
        Some(record)
    }

    /// If `name`'s active run has stopped, or a provider's part of it
    /// has (R-RN8), and its gaps are not written yet: one gap record per
    /// stream it checkpointed in its mode, with the last committed cursor
    /// and the stop reason (one record with no cursor when there is no
    /// checkpoint yet) — the remainder, deferred and resumable. A
    /// provider's stop names the provider.
    pub(super) fn settle(&self, reg: &mut Registry, name: &str, mode: Mode) {
        let Some(active) = reg.slots.get(name).and_then(|s| s.active.get(&mode)) else {
            return;
        };
        let now = Instant::now();
        let state = active.handle.state();
        let providers: Vec<(String, StopReason)> = state
            .stopped_providers()
            .filter(|(p, _)| !active.settled_providers.contains(*p))
            .map(|(p, r)| (p.to_string(), r))
            .collect();
        let run_stop = if active.settled {
            None
        } else {
            match state.stopped {
                Some(r) => Some(r),
                // A deadline that passed with no request to see it.
                None if state.envelope.deadline.is_some_and(|d| now >= d) => {
                    active.handle.stop(StopReason::Deadline);
                    Some(StopReason::Deadline)
                }
                None => None,
            }
        };
        for (provider, reason) in providers {
            let written = self.write_gaps(reg, name, mode, reason.label(), Some(&provider));
            if let Some(active) = reg
                .slots
                .get_mut(name)
                .and_then(|s| s.active.get_mut(&mode))
            {
                active.settled_providers.insert(provider.clone());
            }
            tracing::info!(collector = %name, provider = %provider, reason = reason.label(), gaps = written, "a provider's part of the run stopped; its remainder deferred as gap records");
        }
        if let Some(reason) = run_stop {
            let written = self.write_gaps(reg, name, mode, reason.label(), None);
            if let Some(active) = reg
                .slots
                .get_mut(name)
                .and_then(|s| s.active.get_mut(&mode))
            {
                active.settled = true;
            }
            tracing::info!(collector = %name, reason = reason.label(), gaps = written, "run stopped; remainder deferred as gap records");
        }
    }

    /// Opens a run for `name`, or says which run holds the lease. With
    /// `wait`, waits up to that long for the lease to be released or to
    /// lapse.
    pub async fn open(
        &self,
        name: &str,
        opening: Opening,
        wait: Duration,
    ) -> Result<RunView, RunError> {
        let give_up = Instant::now() + wait;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let lease_until = match self.try_open(name, &opening) {
                Ok(view) => {
                    // The lease and its fencing token are on disk before
                    // anyone holds them.
                    if self.writer.is_some() {
                        self.flush().await?;
                    }
                    return Ok(view);
                }
                Err((RunError::Held(holder), lease_until)) => {
                    if Instant::now() >= give_up {
                        return Err(RunError::Held(holder));
                    }
                    lease_until
                }
                Err((e, _)) => return Err(e),
            };
            // Until the lease is released, lapses, or the wait is over.
            let wake = give_up.min(lease_until + Duration::from_millis(1));
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    pub(super) fn try_open(
        &self,
        name: &str,
        opening: &Opening,
    ) -> Result<RunView, (RunError, Instant)> {
        let now = Instant::now();
        self.sweep(now);
        let mut reg = self.lock();
        let Some(slot) = reg.slots.get(name) else {
            return Err((RunError::UnknownCollector, now));
        };
        // One active run per collector and mode (R-RN4): a steady run and
        // a catch-up run go on side by side (R-FS1).
        if let Some(a) = slot.active.get(&opening.mode) {
            return Err((RunError::Held(a.record.id.clone()), a.lease_until));
        }
        let seq = self.next_seq(&mut reg);
        let (ttl, max_waits) = (reg.lease_ttl, reg.max_cooldown_waits);
        let slot = reg.slots.get_mut(name).expect("checked above");
        slot.fence += 1;
        let fence = slot.fence;
        let record = RunRecord {
            id: format!("{name}.{seq}"),
            collector: name.to_string(),
            mode: opening.mode,
            request_cap: opening.request_cap,
            deadline_s: opening.deadline_s,
            retry_ratio: opening.retry_ratio,
            fencing_token: fence,
            started_unix_ms: unix_ms_now(),
            ended_unix_ms: None,
            phase: Phase::Active,
            stop_reason: None,
            provider_stops: Default::default(),
            attempts: 0,
            units: 0,
            retries: 0,
            cooldown_waits: 0,
            refusals: BTreeMap::new(),
            gaps_recorded: 0,
            gaps_posted: 0,
            failed: BTreeMap::new(),
            lease_until_unix_ms: Some(ms_from(now, now + ttl)),
            attempts_reserved: 0,
            streams: Vec::new(),
            providers: BTreeMap::new(),
        };
        let handle = RunHandle::new(Envelope {
            request_cap: opening.request_cap,
            deadline: opening.deadline_s.map(|s| now + Duration::from_secs_f64(s)),
            retry_budget: None,
            retry_ratio: opening.retry_ratio,
            max_cooldown_waits: max_waits,
        });
        let active = Active {
            record: record.clone(),
            handle,
            lease_until: now + ttl,
            settled: false,
            settled_providers: Default::default(),
            streams: Default::default(),
            counted: 0,
            lease_written_ms: ms_from(now, now + ttl),
        };
        let view = RunView {
            record,
            lease_expires_unix_ms: Some(ms_from(now, active.lease_until)),
        };
        self.reserving(&active.handle, &active.record.id, 0);
        slot.active.insert(opening.mode, active);
        if let Some(w) = &self.writer {
            w.put(RunTree::Meta, fence_key(name), fence.to_be_bytes().to_vec());
        }
        self.write(RunTree::Runs, seq_key(name, seq), &view.record);
        Ok(view)
    }

    /// The run `id`, live if active.
    pub fn get(&self, id: &str) -> Result<RunView, RunError> {
        self.sweep(Instant::now());
        let (name, seq) = split_id(id).ok_or(RunError::UnknownRun)?;
        let reg = self.lock();
        let slot = reg.slots.get(name).ok_or(RunError::UnknownRun)?;
        if let Some(a) = slot.active.values().find(|a| a.record.id == id) {
            return Ok(RunView {
                record: a.snapshot(),
                lease_expires_unix_ms: Some(ms_from(Instant::now(), a.lease_until)),
            });
        }
        if let Some(r) = reg.ended.get(id) {
            return Ok(RunView {
                record: r.clone(),
                lease_expires_unix_ms: None,
            });
        }
        let stored = self
            .store
            .as_ref()
            .and_then(|s| s.get(RunTree::Runs, &seq_key(name, seq)))
            .and_then(|v| serde_json::from_slice::<RunRecord>(&v).ok())
            .ok_or(RunError::UnknownRun)?;
        Ok(RunView {
            record: stored,
            lease_expires_unix_ms: None,
        })
    }

    /// `name`'s runs, newest first, at most `limit` (reading its own
    /// writes: a run that just ended is there).
    pub async fn history(&self, name: &str, limit: usize) -> Result<Vec<RunRecord>, RunError> {
        self.sweep(Instant::now());
        self.applied().await;
        let reg = self.lock();
        let slot = reg.slots.get(name).ok_or(RunError::UnknownCollector)?;
        let mut out: Vec<RunRecord> = slot.active.values().map(Active::snapshot).collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.started_unix_ms));
        match &self.store {
            Some(store) => {
                for (_, v) in store.scan_newest(RunTree::Runs, &prefix(name)) {
                    if out.len() >= limit {
                        break;
                    }
                    if let Ok(r) = serde_json::from_slice::<RunRecord>(&v) {
                        if !out.iter().any(|o| o.id == r.id) {
                            out.push(r);
                        }
                    }
                }
            }
            None => {
                let mut ended: Vec<_> = reg
                    .ended
                    .values()
                    .filter(|r| r.collector == name)
                    .cloned()
                    .collect();
                ended.sort_by_key(|r| std::cmp::Reverse(r.started_unix_ms));
                out.extend(ended);
            }
        }
        out.truncate(limit);
        Ok(out)
    }

    /// Renews the lease of the active run `id`.
    pub fn heartbeat(&self, id: &str) -> Result<RunView, RunError> {
        let now = Instant::now();
        self.sweep(now);
        let mut reg = self.lock();
        let ttl = reg.lease_ttl;
        let active = self.active(&mut reg, id)?;
        active.lease_until = now + ttl;
        active.lease_written_ms = ms_from(now, active.lease_until);
        let record = active.snapshot();
        let name = record.collector.clone();
        if let Some((_, seq)) = split_id(&record.id) {
            self.write(RunTree::Runs, seq_key(&name, seq), &record);
        }
        Ok(RunView {
            record,
            lease_expires_unix_ms: Some(ms_from(now, active.lease_until)),
        })
    }

    /// Finishes the active run `id`: its summary. `exit_status`: how its
    /// command ended, when `sluice run` says. A command that failed after
    /// providers failed its requests failed because of them: their parts
    /// of the run stop with `upstream_error` (source pressure) and the
    /// remainder is recorded as gap records naming them — a run never ends
    /// with no stop and no gap after failing its collector.
    pub fn finish(&self, id: &str, exit_status: Option<i64>) -> Result<RunRecord, RunError> {
        self.sweep(Instant::now());
        let mut reg = self.lock();
        let active = self.active(&mut reg, id)?;
        let mode = active.record.mode;
        if exit_status.is_some_and(|s| s != 0) {
            for provider in active.record.failed.keys() {
                active
                    .handle
                    .stop_provider(provider, StopReason::UpstreamError);
            }
        }
        let name = split_id(id).map(|(n, _)| n.to_string()).unwrap_or_default();
        self.settle(&mut reg, &name, mode);
        let record = self
            .end(&mut reg, &name, mode, Phase::Finished)
            .ok_or(RunError::UnknownRun)?;
        self.flush_soon();
        Ok(record)
    }

    /// The run a request from proxy user `user` belongs to, if its
    /// collector has one active, and the run's mode: the run of `mode` when
    /// the credentials name one (`NAME+catchup`), else the steady run, else
    /// the catch-up run. The request renews the lease. (Its attempts leave
    /// within the run's durable reservation, R-RN10: see
    /// [`RunHandle::reserving`].)
    pub async fn attach(&self, user: &str, mode: Option<Mode>) -> Option<(RunHandle, Mode)> {
        let now = Instant::now();
        let mut reg = self.lock();
        let ttl = reg.lease_ttl;
        let slot = reg.slots.get_mut(user)?;
        let mode = match mode {
            Some(m) => m,
            None => *slot.active.keys().next()?,
        };
        let active = slot.active.get_mut(&mode)?;
        if active.lease_until <= now {
            return None;
        }
        active.lease_until = now + ttl;
        // The lease is written when it moved a quarter of its length.
        let lease_ms = ms_from(now, active.lease_until);
        if lease_ms >= active.lease_written_ms + ttl.as_millis() as u64 / 4 {
            active.lease_written_ms = lease_ms;
            let record = active.snapshot();
            if let Some((_, seq)) = split_id(&record.id) {
                self.write(RunTree::Runs, seq_key(user, seq), &record);
            }
        }
        Some((active.handle.clone(), mode))
    }

    /// After a run's request: counts sluice's refusal, if it was one, and
    /// the provider's failure passed to the collector, if it was one; and
    /// writes the gap records if the run has stopped.
    pub fn after(&self, user: &str, run: &RunHandle, provider: Option<&str>, answer: Answer<'_>) {
        let mut reg = self.lock();
        let Some(active) = reg
            .slots
            .get_mut(user)
            .and_then(|s| s.active.values_mut().find(|a| a.handle.same(run)))
        else {
            return;
        };
        let mode = active.record.mode;
        let error = match answer {
            Answer::Failed(e) => Some(e),
            Answer::Status(_) => None,
        };
        let refusal = match error {
            Some(Cause::RunStopped(s)) => Some(s.reason.label()),
            Some(Cause::CircuitOpen(_)) => Some("circuit_open"),
            Some(Cause::RateLimited(_)) => Some("rate_limited"),
            Some(Cause::BulkheadFull(_)) => Some("bulkhead_full"),
            Some(Cause::ProviderDown(_)) => Some("provider_down"),
            Some(Cause::AttemptTimeout | Cause::RequestTimeout(_) | Cause::Upstream(_)) | None => {
                None
            }
        };
        if let Some(r) = refusal {
            *active.record.refusals.entry(r.to_string()).or_default() += 1;
        }
        let failed = match answer {
            Answer::Status(s) => s == 429 || s >= 500,
            Answer::Failed(e) => match e {
                Cause::RunStopped(_) => false,
                e => e.info().fault != Fault::Client,
            },
        };
        if let (true, Some(p)) = (failed, provider) {
            *active.record.failed.entry(p.to_string()).or_default() += 1;
        }
        self.count_attempts(user, active);
        self.settle(&mut reg, user, mode);
    }

    /// On shutdown: active runs are written as they stand, to go on after
    /// the restart (R-RN10).
    pub fn suspend_all(&self) {
        // Runs outlive sluice (R-RN10): an active run is written as it
        // stands — counters, reservation, lease — and goes on after a
        // restart while its lease holds; a lease that lapses while sluice
        // is down ends it (interrupted) at the next start.
        let reg = self.lock();
        for (name, slot) in &reg.slots {
            for active in slot.active.values() {
                let record = active.snapshot();
                if let Some((_, seq)) = split_id(&record.id) {
                    self.write(RunTree::Runs, seq_key(name, seq), &record);
                }
            }
        }
    }
}

/// An active run read back from the store (R-RN10): its budgets, its
/// attempts counted from the reservation (never fewer than were made), its
/// stops, and the rest of its lease.
pub(super) fn resume(
    record: RunRecord,
    reserved: u64,
    now_ms: u64,
    max_cooldown_waits: u32,
) -> Active {
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

pub(super) fn fence_key(name: &str) -> Vec<u8> {
    let mut k = b"fence\0".to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}
