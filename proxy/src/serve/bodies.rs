//! The run API's JSON bodies, read without any state (R-SF3): what a run
//! is opened with, a checkpoint commit, a gap record. Each either parses or
//! names the field that is wrong — never a panic — so they are fuzzed as
//! they are (`fuzz/fuzz_targets/run_bodies.rs`).

use std::time::Duration;

use http::StatusCode;
use serde_json::{Map, Value};

use crate::runs::records::{Mode, GAP_REASONS};
use crate::runs::Opening;

/// The longest a `POST …/runs` may wait for the lease.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// What was wrong with a request, before it becomes the `4xx`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The status to answer.
    pub status: StatusCode,
    /// The field that is wrong (`body` for the body as a whole).
    pub field: String,
    /// What is wrong with it.
    pub why: String,
}

/// An [`Invalid`].
pub fn invalid(status: StatusCode, field: &str, why: impl Into<String>) -> Invalid {
    Invalid {
        status,
        field: field.to_string(),
        why: why.into(),
    }
}

/// A body as a JSON object; an empty (or blank) body is an empty object.
pub fn object(bytes: &[u8]) -> Result<Map<String, Value>, Invalid> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(invalid(StatusCode::BAD_REQUEST, "body", "a JSON object")),
        Err(e) => Err(invalid(
            StatusCode::BAD_REQUEST,
            "body",
            format!("malformed JSON: {e}"),
        )),
    }
}

/// `POST /v1/collectors/{name}/runs`: the run's envelope and how long to
/// wait for the lease.
pub fn opening(map: &Map<String, Value>) -> Result<(Opening, Duration), Invalid> {
    let f = Fields::new(
        map,
        &["request_cap", "deadline_s", "retry_ratio", "mode", "wait_s"],
    )?;
    let opening = Opening {
        request_cap: f.count("request_cap")?,
        deadline_s: f.positive("deadline_s", 366.0 * 86400.0)?,
        retry_ratio: match f.value("retry_ratio") {
            None => None,
            Some(v) => match v.as_f64() {
                Some(r) if r.is_finite() && (0.0..=10.0).contains(&r) => Some(r),
                _ => {
                    return Err(invalid(
                        StatusCode::BAD_REQUEST,
                        "retry_ratio",
                        "a number from 0 to 10",
                    ))
                }
            },
        },
        mode: f.mode("mode")?.unwrap_or_default(),
    };
    let wait = f
        .positive("wait_s", MAX_WAIT.as_secs_f64())?
        .map_or(Duration::ZERO, Duration::from_secs_f64);
    Ok((opening, wait))
}

/// `PUT /v1/runs/{id}/checkpoints/{stream}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// The run's mode.
    pub mode: Mode,
    /// Forward-only position.
    pub slice: u64,
    /// The collector's cursor, kept byte for byte.
    pub cursor: String,
    /// The lease's fencing token.
    pub fencing_token: u64,
}

/// A checkpoint commit; every field required.
pub fn commit(map: &Map<String, Value>) -> Result<Commit, Invalid> {
    let f = Fields::new(map, &["mode", "slice", "cursor", "fencing_token"])?;
    let need = |field: &str| invalid(StatusCode::BAD_REQUEST, field, "required");
    Ok(Commit {
        mode: f.mode("mode")?.ok_or_else(|| need("mode"))?,
        slice: f.count("slice")?.ok_or_else(|| need("slice"))?,
        cursor: f.text("cursor")?.ok_or_else(|| need("cursor"))?,
        fencing_token: f
            .count("fencing_token")?
            .ok_or_else(|| need("fencing_token"))?,
    })
}

/// `POST /v1/runs/{id}/gaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapBody {
    /// The stream (never empty).
    pub stream: String,
    /// Where the gap starts, if known.
    pub cursor: Option<String>,
    /// One of [`GAP_REASONS`].
    pub reason: String,
    /// Free text.
    pub detail: Option<String>,
}

/// A gap record a collector posts.
pub fn gap(map: &Map<String, Value>) -> Result<GapBody, Invalid> {
    let f = Fields::new(map, &["stream", "cursor", "reason", "detail"])?;
    let stream = f
        .text("stream")?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid(StatusCode::BAD_REQUEST, "stream", "required"))?;
    let reason = f
        .text("reason")?
        .ok_or_else(|| invalid(StatusCode::BAD_REQUEST, "reason", "required"))?;
    if !GAP_REASONS.contains(&reason.as_str()) {
        return Err(invalid(
            StatusCode::BAD_REQUEST,
            "reason",
            format!("one of {}", GAP_REASONS.join(", ")),
        ));
    }
    Ok(GapBody {
        stream,
        cursor: f.text("cursor")?,
        reason,
        detail: f.text("detail")?,
    })
}

/// Reads the optional fields of a JSON object, naming the one that is
/// wrong; fields it does not know are refused too.
struct Fields<'a> {
    map: &'a Map<String, Value>,
}

type Field<T> = Result<Option<T>, Invalid>;

impl<'a> Fields<'a> {
    fn new(map: &'a Map<String, Value>, known: &[&str]) -> Result<Self, Invalid> {
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            // A key "" names nothing (found by fuzzing: a 400 naming "").
            if unknown.is_empty() {
                return Err(invalid(
                    StatusCode::BAD_REQUEST,
                    "body",
                    "a field with an empty name",
                ));
            }
            return Err(invalid(StatusCode::BAD_REQUEST, unknown, "unknown field"));
        }
        Ok(Fields { map })
    }

    fn value(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn count(&self, name: &str) -> Field<u64> {
        match self.value(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| invalid(StatusCode::BAD_REQUEST, name, "a whole number ≥ 0")),
        }
    }

    fn positive(&self, name: &str, max: f64) -> Field<f64> {
        match self.value(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 && x <= max => Ok(Some(x)),
                _ => Err(invalid(
                    StatusCode::BAD_REQUEST,
                    name,
                    format!("a number > 0 and ≤ {max}"),
                )),
            },
        }
    }

    fn text(&self, name: &str) -> Field<String> {
        match self.value(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid(StatusCode::BAD_REQUEST, name, "a string")),
        }
    }

    fn mode(&self, name: &str) -> Field<Mode> {
        match self.text(name)? {
            None => Ok(None),
            Some(m) => Mode::parse(&m)
                .map(Some)
                .ok_or_else(|| invalid(StatusCode::BAD_REQUEST, name, "\"steady\" or \"catchup\"")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing (`run_bodies`): an empty key was refused naming the
    /// field "".
    #[test]
    fn an_empty_key_is_refused_naming_the_body() {
        let map = object(br#"{"mode":"steady","":12}"#).unwrap();
        for e in [
            opening(&map).unwrap_err(),
            commit(&map).unwrap_err(),
            gap(&map).unwrap_err(),
        ] {
            assert_eq!(
                (e.status.as_u16(), e.field.as_str()),
                (400, "body"),
                "{e:?}"
            );
        }
    }

    proptest::proptest! {
        /// The fuzz target's property, in CI: any body is parsed or
        /// refused with a 4xx naming a field (R-SF3).
        #[test]
        fn any_body_parses_or_names_a_field(text in "\\PC{0,120}") {
            let named = |e: Invalid| e.status.is_client_error() && !e.field.is_empty();
            match object(text.as_bytes()) {
                Err(e) => proptest::prop_assert!(named(e)),
                Ok(map) => {
                    proptest::prop_assert!(opening(&map).err().is_none_or(named));
                    proptest::prop_assert!(commit(&map).err().is_none_or(named));
                    proptest::prop_assert!(gap(&map).err().is_none_or(named));
                }
            }
        }

        /// Objects of the right shape with arbitrary values.
        #[test]
        fn any_values_parse_or_name_a_field(
            slice in proptest::num::i64::ANY,
            ratio in proptest::num::f64::ANY,
            mode in "[a-z]{0,8}",
            reason in "[a-z_]{0,16}",
        ) {
            let v = serde_json::json!({
                "request_cap": slice, "retry_ratio": ratio, "mode": mode, "wait_s": ratio,
            });
            let map = v.as_object().unwrap();
            proptest::prop_assert!(opening(map).err().is_none_or(|e| !e.field.is_empty()));
            let v = serde_json::json!({ "mode": mode, "slice": slice, "cursor": "c", "fencing_token": 1 });
            proptest::prop_assert!(commit(v.as_object().unwrap()).err().is_none_or(|e| !e.field.is_empty()));
            let v = serde_json::json!({ "stream": "s", "reason": reason });
            proptest::prop_assert!(gap(v.as_object().unwrap()).err().is_none_or(|e| !e.field.is_empty()));
        }
    }
}
