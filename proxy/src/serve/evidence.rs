//! A provider's breaker evidence as the admin API shows it (R-CB2): from
//! the store when there is one (it survives restarts), else the in-memory
//! log. Both the provider readout and a run's view (its providers'
//! transitions while it was on) show it.

use serde_json::{json, Value};
use sluice_policy::breaker::Transition;
use tokio::time::Instant;

use crate::app::App;
use crate::store::EvidenceRecord;

fn evidence_json(e: &EvidenceRecord) -> Value {
    json!({
        "at_unix_ms": e.at_unix_ms,
        "from": e.from,
        "to": e.to,
        "reason": e.reason,
        "elapsed_ms": e.elapsed_ms,
        "calls": e.calls,
        "failures": e.failures,
        "retry_budget_left": e.retry_budget_left,
    })
}

/// Evidence from the store (it survives restarts), else the in-memory log.
pub(super) fn evidence(app: &App, name: &str, recent: &[Transition]) -> Vec<Value> {
    match &app.store {
        Some(store) => store.evidence(name).iter().map(evidence_json).collect(),
        None => {
            let now = Instant::now();
            recent
                .iter()
                .map(|t| evidence_json(&EvidenceRecord::of(t, now.saturating_duration_since(t.at))))
                .collect()
        }
    }
}
