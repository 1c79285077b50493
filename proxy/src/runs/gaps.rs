//! Gap records (R-RN5, R-RN12): the remainder of a stopped run, one open
//! budget gap per stream, mode and provider, superseded by newer stops and
//! resolved by a later run's commits; collectors' own gaps; byte-bounded
//! pages.

use tokio::time::Instant;

use super::records::{prefix, seq_key, split_id, Gap, Mode, GAP_REASONS};
use super::{GapPage, Registry, RunError, Runs};
use crate::store::{unix_ms_now, RunTree};

impl Runs {
    /// Writes the gap records of a stop (see [`Runs::settle`]): one per
    /// stream the run checkpointed, or one `*` when it checkpointed none;
    /// each supersedes the open stop gap of its stream and mode. Writes the
    /// run's record with their count; returns how many.
    pub(super) fn write_gaps(
        &self,
        reg: &mut Registry,
        name: &str,
        mode: Mode,
        reason: &str,
        provider: Option<&str>,
    ) -> u64 {
        let Some(active) = reg.slots.get(name).and_then(|s| s.active.get(&mode)) else {
            return 0;
        };
        let run_id = active.record.id.clone();
        let mut streams: Vec<String> = active.streams.iter().cloned().collect();
        if streams.is_empty() {
            streams.push("*".to_string());
        }
        let mut written = 0;
        for stream in streams {
            let gap = self.stop_gap(reg, name, mode, &stream, reason, provider, &run_id);
            written += u64::from(gap.is_some());
        }
        if let Some(active) = reg
            .slots
            .get_mut(name)
            .and_then(|s| s.active.get_mut(&mode))
        {
            active.record.gaps_recorded += written;
            let record = active.snapshot();
            if let Some((_, seq)) = split_id(&record.id) {
                self.write(RunTree::Runs, seq_key(name, seq), &record);
            }
        }
        self.flush_soon();
        written
    }

    /// Records a stop's gap of one stream and mode, with the stream's
    /// cursor as it stands, superseding the open one (R-RN12).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stop_gap(
        &self,
        reg: &mut Registry,
        name: &str,
        mode: Mode,
        stream: &str,
        reason: &str,
        provider: Option<&str>,
        run_id: &str,
    ) -> Option<Gap> {
        let at = reg
            .checkpoints
            .get(&(name.to_string(), mode, stream.to_string()));
        let (cursor, slice) = (at.map(|c| c.cursor.clone()), at.map(|c| c.slice));
        let key = (
            name.to_string(),
            mode,
            stream.to_string(),
            provider.map(str::to_string),
        );
        if let Some(old) = reg.stop_gaps.remove(&key) {
            self.drop_gap(reg, name, &old.id);
        }
        let seq = self.next_seq(reg);
        let gap = Gap {
            id: format!("{name}.{seq}"),
            stream: stream.to_string(),
            cursor,
            reason: reason.to_string(),
            detail: None,
            run: Some(run_id.to_string()),
            provider: provider.map(str::to_string),
            mode: Some(mode),
            slice,
            stop: true,
            at_unix_ms: unix_ms_now(),
        };
        self.write(RunTree::Gaps, seq_key(name, seq), &gap);
        if let Some(slot) = reg.slots.get_mut(name) {
            slot.pending_gaps += 1;
        }
        reg.stop_gaps.insert(key, gap.clone());
        Some(gap)
    }

    /// Removes a pending gap record from the store and the count.
    pub(super) fn drop_gap(&self, reg: &mut Registry, name: &str, id: &str) {
        if let (Some(w), Some((_, seq))) = (&self.writer, split_id(id)) {
            w.remove(RunTree::Gaps, seq_key(name, seq));
        }
        if let Some(slot) = reg.slots.get_mut(name) {
            slot.pending_gaps = slot.pending_gaps.saturating_sub(1);
        }
    }

    /// As a run ends: its stop's gaps take the cursors as of the end of
    /// the run (a collector may commit after the `403`), and a `*` gap
    /// gives way to the streams the run committed after all (R-RN12).
    pub(super) fn finalize_stop_gaps(&self, reg: &mut Registry, name: &str, mode: Mode) {
        let Some(active) = reg.slots.get(name).and_then(|s| s.active.get(&mode)) else {
            return;
        };
        let run_id = active.record.id.clone();
        let streams: Vec<String> = active.streams.iter().cloned().collect();
        let mine: Vec<Gap> = reg
            .stop_gaps
            .iter()
            .filter(|((c, m, _, _), g)| {
                c == name && *m == mode && g.run.as_deref() == Some(&run_id)
            })
            .map(|(_, g)| g.clone())
            .collect();
        let mut changed = false;
        for gap in mine {
            if gap.stream == "*" {
                if streams.is_empty() {
                    continue;
                }
                reg.stop_gaps.remove(&(
                    name.to_string(),
                    mode,
                    "*".to_string(),
                    gap.provider.clone(),
                ));
                self.drop_gap(reg, name, &gap.id);
                for stream in &streams {
                    let key = (name.to_string(), mode, stream.clone(), gap.provider.clone());
                    if reg.stop_gaps.get(&key).and_then(|g| g.run.as_deref()) != Some(&run_id) {
                        self.stop_gap(
                            reg,
                            name,
                            mode,
                            stream,
                            &gap.reason,
                            gap.provider.as_deref(),
                            &run_id,
                        );
                    }
                }
                changed = true;
                continue;
            }
            let Some(now) = reg
                .checkpoints
                .get(&(name.to_string(), mode, gap.stream.clone()))
            else {
                continue;
            };
            let key = (
                name.to_string(),
                mode,
                gap.stream.clone(),
                gap.provider.clone(),
            );
            if gap.slice != Some(now.slice) {
                let mut gap = gap;
                gap.cursor = Some(now.cursor.clone());
                gap.slice = Some(now.slice);
                if let Some((_, seq)) = split_id(&gap.id) {
                    self.write(RunTree::Gaps, seq_key(name, seq), &gap);
                }
                reg.stop_gaps.insert(key, gap);
                changed = true;
            }
        }
        if changed {
            self.flush_soon();
        }
    }

    /// Records a gap for the active run `id` (R-RN6); answered once
    /// flushed. `reason` must be one of [`GAP_REASONS`] (checked by the
    /// caller, which names the field).
    pub async fn add_gap(
        &self,
        id: &str,
        stream: String,
        cursor: Option<String>,
        reason: String,
        detail: Option<String>,
    ) -> Result<Gap, RunError> {
        debug_assert!(GAP_REASONS.contains(&reason.as_str()));
        self.sweep(Instant::now());
        let gap = {
            let mut reg = self.lock();
            let active = self.active(&mut reg, id)?;
            let (name, mode) = (active.record.collector.clone(), active.record.mode);
            if self.writer.is_none() {
                return Err(RunError::NotDurable("no state store".into()));
            }
            active.record.gaps_posted += 1;
            let seq = self.next_seq(&mut reg);
            let gap = Gap {
                id: format!("{name}.{seq}"),
                stream,
                cursor,
                reason,
                detail,
                run: Some(id.to_string()),
                provider: None,
                mode: Some(mode),
                slice: None,
                stop: false,
                at_unix_ms: unix_ms_now(),
            };
            if !self.write(RunTree::Gaps, seq_key(&name, seq), &gap) {
                return Err(RunError::NotDurable(
                    "the store's write queue is full; try again".into(),
                ));
            }
            if let Some(slot) = reg.slots.get_mut(&name) {
                slot.pending_gaps += 1;
            }
            gap
        };
        self.flush().await?;
        Ok(gap)
    }

    /// One page of `name`'s pending gaps after `after` (a previous page's
    /// `next`), at most `max_bytes` of serialized records — except that a
    /// record larger than that comes alone, so paging always advances.
    /// Reads its own writes: what was queued before (a stop's gap, a run's
    /// end updating it) is applied first.
    pub async fn gaps(
        &self,
        name: &str,
        max_bytes: usize,
        after: Option<&str>,
    ) -> Result<GapPage, RunError> {
        if !self.is_collector(name) {
            return Err(RunError::UnknownCollector);
        }
        let Some(store) = &self.store else {
            return Ok(GapPage {
                gaps: Vec::new(),
                next: None,
            });
        };
        self.applied().await;
        let start = match after.and_then(split_id) {
            Some((_, seq)) => seq_key(name, seq.saturating_add(1)),
            None => prefix(name),
        };
        let mut gaps = Vec::new();
        let mut used = 0;
        let mut more = false;
        for (_, value) in store.scan(RunTree::Gaps, &prefix(name), &start) {
            let Ok(gap) = serde_json::from_slice::<Gap>(&value) else {
                continue;
            };
            let size = serde_json::to_vec(&gap).map_or(0, |v| v.len());
            if !gaps.is_empty() && used + size > max_bytes {
                more = true;
                break;
            }
            used += size;
            gaps.push(gap);
            if used >= max_bytes {
                // A lone oversize record, or exactly full: the next page
                // starts after it (if there is one).
                more = true;
                break;
            }
        }
        let next = if more {
            gaps.last().map(|g| g.id.clone())
        } else {
            None
        };
        Ok(GapPage { gaps, next })
    }

    /// Resolves a gap record: it is no longer pending.
    pub async fn resolve_gap(&self, id: &str) -> Result<(), RunError> {
        let (name, seq) = split_id(id).ok_or(RunError::UnknownGap)?;
        self.applied().await;
        let exists = self
            .store
            .as_ref()
            .and_then(|s| s.get(RunTree::Gaps, &seq_key(name, seq)))
            .is_some();
        if !exists {
            return Err(RunError::UnknownGap);
        }
        if let Some(w) = &self.writer {
            w.remove(RunTree::Gaps, seq_key(name, seq));
        }
        self.flush().await?;
        let mut reg = self.lock();
        reg.stop_gaps.retain(|_, g| g.id != id);
        if let Some(slot) = reg.slots.get_mut(name) {
            slot.pending_gaps = slot.pending_gaps.saturating_sub(1);
        }
        Ok(())
    }
}
