//! Checkpoints (R-RN4, R-RN6): forward-only, fenced commits per
//! collector, mode and stream, answered only once durable; a commit past a
//! stop gap's cursor resolves it.

use tokio::time::Instant;

use super::records::{checkpoint_key, seq_key, split_id, Checkpoint, Mode};
use super::{GapKey, RunError, Runs};
use crate::store::{unix_ms_now, RunTree};

impl Runs {
    /// Commits a checkpoint for the active run `id` (R-RN5): answered once
    /// the store has flushed it.
    pub async fn checkpoint(
        &self,
        id: &str,
        stream: &str,
        mode: Mode,
        slice: u64,
        cursor: String,
        fencing_token: u64,
    ) -> Result<Checkpoint, RunError> {
        self.sweep(Instant::now());
        let (name, key, previous, checkpoint) = {
            let mut reg = self.lock();
            let active = self.active(&mut reg, id)?;
            if active.record.fencing_token != fencing_token {
                return Err(RunError::StaleFence(active.record.fencing_token));
            }
            if active.record.mode != mode {
                return Err(RunError::WrongMode {
                    run: active.record.mode.label(),
                    given: mode.label(),
                });
            }
            let name = active.record.collector.clone();
            let index = (name.clone(), mode, stream.to_string());
            if let Some(stored) = reg.checkpoints.get(&index) {
                if slice <= stored.slice {
                    return Err(RunError::SliceNotAdvancing {
                        given: slice,
                        stored: stored.slice,
                    });
                }
            }
            if self.writer.is_none() {
                return Err(RunError::NotDurable("no state store".into()));
            }
            let checkpoint = Checkpoint {
                slice,
                cursor,
                run: id.to_string(),
                at_unix_ms: unix_ms_now(),
            };
            let key = checkpoint_key(&name, mode, stream);
            if !self.write(RunTree::Checkpoints, key.clone(), &checkpoint) {
                // Dropped before the disk: not committed, nothing changed.
                return Err(RunError::NotDurable(
                    "the store's write queue is full; try again".into(),
                ));
            }
            let previous = reg.checkpoints.insert(index, checkpoint.clone());
            if let Some(active) = reg
                .slots
                .get_mut(&name)
                .and_then(|s| s.active.get_mut(&mode))
            {
                // The run's streams are durable with the commit (R-RN10):
                // a run cut short by a crash records its gaps at the
                // cursors of every stream it committed, not one `*` gap.
                if active.streams.insert(stream.to_string()) {
                    let record = active.snapshot();
                    if let Some((_, seq)) = split_id(&record.id) {
                        self.write(RunTree::Runs, seq_key(&name, seq), &record);
                    }
                }
            }
            (name, key, previous, checkpoint)
        };
        if let Err(e) = self.flush().await {
            // Not durable: not committed.
            self.roll_back(name, mode, stream, key, previous, &checkpoint);
            return Err(e);
        }
        if let Some(m) = &self.metrics {
            m.checkpoint_commits.with_label_values(&[&name]).inc();
        }
        self.resolve_by_commit(&name, mode, stream, &checkpoint);
        Ok(checkpoint)
    }

    /// A checkpoint that did not reach the disk is taken back: the one
    /// before it stands again (unless a later commit replaced it).
    fn roll_back(
        &self,
        name: String,
        mode: Mode,
        stream: &str,
        key: Vec<u8>,
        previous: Option<Checkpoint>,
        checkpoint: &Checkpoint,
    ) {
        let mut reg = self.lock();
        let index = (name, mode, stream.to_string());
        if reg.checkpoints.get(&index) != Some(checkpoint) {
            return;
        }
        match previous {
            Some(p) => {
                self.write(RunTree::Checkpoints, key, &p);
                reg.checkpoints.insert(index, p);
            }
            None => {
                reg.checkpoints.remove(&index);
                if let Some(w) = &self.writer {
                    w.remove(RunTree::Checkpoints, key);
                }
            }
        }
    }

    /// A later run's commit past a stop's gap resolves it: the work it
    /// deferred is being done. A `*` gap (the stopped run checkpointed
    /// nothing) is resolved by any later commit in its mode (R-RN12).
    pub(super) fn resolve_by_commit(&self, name: &str, mode: Mode, stream: &str, c: &Checkpoint) {
        let mut reg = self.lock();
        let past: Vec<GapKey> = reg
            .stop_gaps
            .iter()
            .filter(|((n, m, s, _), g)| {
                n == name
                    && *m == mode
                    && (s == stream || s == "*")
                    && g.run.as_deref() != Some(c.run.as_str())
                    && (s == "*" || g.slice.is_none_or(|at| c.slice > at))
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut resolved = Vec::new();
        for key in past {
            if let Some(g) = reg.stop_gaps.remove(&key) {
                resolved.push(g.id);
            }
        }
        for id in &resolved {
            self.drop_gap(&mut reg, name, id);
        }
        drop(reg);
        if !resolved.is_empty() {
            self.flush_soon();
        }
    }

    /// `name`'s committed checkpoints.
    pub fn checkpoints(&self, name: &str) -> Result<Vec<(Mode, String, Checkpoint)>, RunError> {
        let reg = self.lock();
        if !reg.slots.contains_key(name) {
            return Err(RunError::UnknownCollector);
        }
        Ok(reg
            .checkpoints
            .iter()
            .filter(|((c, _, _), _)| c == name)
            .map(|((_, m, s), cp)| (*m, s.clone(), cp.clone()))
            .collect())
    }

    /// Resets one stream's checkpoint in one mode; `true` if there was one.
    pub async fn reset_checkpoint(
        &self,
        name: &str,
        stream: &str,
        mode: Mode,
    ) -> Result<bool, RunError> {
        let removed = {
            let mut reg = self.lock();
            if !reg.slots.contains_key(name) {
                return Err(RunError::UnknownCollector);
            }
            reg.checkpoints
                .remove(&(name.to_string(), mode, stream.to_string()))
                .is_some()
        };
        if removed {
            if let Some(w) = &self.writer {
                w.remove(RunTree::Checkpoints, checkpoint_key(name, mode, stream));
            }
            self.flush().await?;
        }
        Ok(removed)
    }
}
