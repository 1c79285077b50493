//! A run's life (R-RN1, R-RN2, R-RN10): opening it under a fenced lease,
//! heartbeats, finishing, the sweep that ends lapsed leases and passed
//! deadlines, attaching a collector's requests to its run (what the store
//! gives back after a restart is `restore.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_policy::error::{Cause, Fault};
use sluice_policy::run::{Envelope, RunHandle, StopReason};
use tokio::time::Instant;

use super::records::{prefix, seq_key, split_id, Mode, Phase, RunRecord};
use super::{ms_from, reserve_key, Active, Answer, Opening, Registry, RunError, RunView, Runs};
use crate::store::{unix_ms_now, RunTree};

impl Runs {
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

pub(super) fn fence_key(name: &str) -> Vec<u8> {
    let mut k = b"fence\0".to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}
