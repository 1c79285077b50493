//! `sluice status` (R-OP7): the admin page's picture as a terminal table,
//! for SSH-only hosts and `kubectl exec` — providers (pace against ceiling
//! and throttle point, what sets it, queue, breaker, last back-off) and
//! collectors (active runs with their budgets, last run, pending gaps),
//! numbers rounded for people. `--watch` redraws it every two seconds.
//!
//! It reads the same JSON readouts as anyone else, with the same
//! credentials: beyond loopback the collectors need a token
//! (`--token-file`). Nothing it prints carries a token, a URL path or a
//! query — the readouts hold none.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use crate::cli::run::call;
use crate::observe::format::num;
use crate::store::unix_ms_now;

/// What `sluice status` was asked.
#[derive(Debug, Clone)]
pub struct StatusCommand {
    /// The admin API.
    pub admin: SocketAddr,
    /// A collector's token, for the collectors' readout beyond loopback.
    pub token: Option<String>,
    /// Redraw every two seconds until interrupted.
    pub watch: bool,
}

/// Prints the status once, or until interrupted with `watch`.
pub async fn status(cmd: StatusCommand) -> ExitCode {
    loop {
        let text = match render(&cmd).await {
            Ok(text) => text,
            Err(e) => {
                eprintln!("sluice status: admin API at {}: {e}", cmd.admin);
                if !cmd.watch {
                    return ExitCode::FAILURE;
                }
                format!("sluice at {}: no answer ({e})\n", cmd.admin)
            }
        };
        if cmd.watch {
            // Home, clear, then the table: one redraw, no scrolling.
            print!("\x1b[H\x1b[2J{text}");
        } else {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        }
    }
}

async fn render(cmd: &StatusCommand) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let token = cmd.token.as_deref();
    let (status, providers) = call(cmd.admin, "GET", "/v1/providers", None, token).await?;
    if status != 200 {
        return Err(format!("/v1/providers answered {status}").into());
    }
    let (_, history) = call(cmd.admin, "GET", "/v1/history", None, token).await?;
    let (cstatus, collectors) = call(cmd.admin, "GET", "/v1/collectors", None, token).await?;
    let now = unix_ms_now();
    let mut out = String::new();
    let _ = writeln!(out, "sluice at {}", cmd.admin);
    let _ = writeln!(out);
    out.push_str(&providers_table(&providers, &history));
    let _ = writeln!(out);
    match cstatus {
        200 => out.push_str(&collectors_table(&collectors, now)),
        401 | 403 => {
            let _ = writeln!(
                out,
                "collectors: the admin API wants a collector's token (--token-file)"
            );
        }
        s => {
            let _ = writeln!(out, "collectors: /v1/collectors answered {s}");
        }
    }
    Ok(out)
}

/// A rate for people, or "unknown".
fn rate(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "unknown".to_string(), |r| format!("{} req/s", num(r)))
}

/// A span of milliseconds for people: `850 ms`, `12 s`, `4 min`, `2.5 h`.
pub fn span(ms: f64) -> String {
    let s = ms / 1000.0;
    if s < 1.0 {
        format!("{} ms", ms.round())
    } else if s < 60.0 {
        format!("{} s", num(s))
    } else if s < 3600.0 {
        format!("{} min", (s / 60.0).round())
    } else if s < 86400.0 {
        format!("{} h", num(s / 3600.0))
    } else {
        format!("{} d", num(s / 86400.0))
    }
}

fn ms(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// What sets a provider's pace, as the page says it.
fn set_by(p: &Value) -> String {
    if let Some(left) = p["hold"]["remaining_ms"].as_f64() {
        return format!("hold, {} left", span(left));
    }
    if p["condition"]["state"] == "outage" {
        return format!(
            "outage, {}",
            span(p["condition"]["since_ms"].as_f64().unwrap_or(0.0))
        );
    }
    match p["pace_authority"].as_str() {
        Some("advertised") => "advertised quota".into(),
        Some("learned_window") => "learned window".into(),
        Some("allowance") => "allowance".into(),
        Some("tokens") => match p["tokens"]["per_request"].as_f64() {
            Some(per) => format!("tokens budget, {} a request", num(per)),
            None => "tokens budget".into(),
        },
        Some("learned") => "learned".into(),
        Some(other) => other.into(),
        None => "unknown".into(),
    }
}

/// Rows under a header, each column as wide as its widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, (cell, w)) in cells.iter().zip(&width).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                let pad = w.saturating_sub(cell.chars().count());
                out.push_str(cell);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        let trimmed = out.trim_end_matches(' ').len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// The providers' table: one row each, live or only known.
fn providers_table(providers: &Value, history: &Value) -> String {
    let list = providers["providers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if list.is_empty() {
        return "providers: none used yet\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            if p["live"] == true {
                live_row(p, &history["providers"][p["name"].as_str().unwrap_or("?")])
            } else {
                known_row(p)
            }
        })
        .collect();
    table(
        &[
            "PROVIDER",
            "PACE",
            "CEILING",
            "THROTTLE AT",
            "SET BY",
            "WAITING",
            "IN FLIGHT",
            "REFUSED (5 MIN)",
            "BREAKER",
            "LAST BACK-OFF",
        ],
        &rows,
    )
}

/// A provider not in the table: learned before (restored from the
/// store), what it starts from; else nothing known yet.
fn known_row(p: &Value) -> Vec<String> {
    let name = p["name"].as_str().unwrap_or("?").to_string();
    let restored = p["restored"] == true;
    let known = |v: &Value| if restored { rate(v) } else { "unknown".into() };
    let mut row = vec![
        name,
        known(&p["rate_rps"]),
        rate(&p["ceiling_rps"]),
        known(&p["throttle_point_rps"]),
        if restored {
            "restored, not used yet".into()
        } else {
            "not used yet".into()
        },
    ];
    row.resize(10, String::new());
    row
}

/// A live provider's row; `h` is its history.
fn live_row(p: &Value, h: &Value) -> Vec<String> {
    let name = p["name"].as_str().unwrap_or("?").to_string();
    let sum = |k: &str| -> u64 {
        h[k].as_array()
            .map_or(0, |a| a.iter().filter_map(Value::as_u64).sum())
    };
    // Over the history's minutes; before its first sample of them, over
    // every attempt since start.
    let (mut sent, mut refused) = (sum("sent"), sum("refused"));
    if sent == 0 {
        sent = p["attempts"]["sent"].as_u64().unwrap_or(0);
        refused = p["attempts"]["throttled"].as_u64().unwrap_or(0);
    }
    let refusals = if sent == 0 {
        "no attempts".to_string()
    } else {
        format!("{} %", num(refused as f64 * 100.0 / sent as f64))
    };
    let b = &p["breaker"];
    let breaker = format!(
        "{} {}",
        b["state"].as_str().unwrap_or("unknown").replace('_', "-"),
        ms(&b["in_state_ms"]).map_or_else(String::new, span)
    );
    let count = |v: &Value| {
        v.as_u64()
            .map_or_else(|| "unknown".into(), |n| n.to_string())
    };
    vec![
        name,
        rate(&p["rate_rps"]),
        rate(&p["ceiling_rps"]),
        rate(&p["throttle_point_rps"]),
        set_by(p),
        count(&p["queue"]["waiting"]),
        count(&p["queue"]["in_flight"]),
        refusals,
        breaker,
        last_backoff(&p["last_backoff"]),
    ]
}

/// "12 s ago: throttled, 40 -> 36 req/s", or "unknown".
fn last_backoff(bo: &Value) -> String {
    match bo.as_object() {
        Some(bo) => format!(
            "{} ago: {}, {} -> {}",
            span(bo.get("ago_ms").and_then(Value::as_f64).unwrap_or(0.0)),
            bo.get("reason")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .replace('_', " "),
            bo.get("from_rps")
                .and_then(Value::as_f64)
                .map_or_else(|| "?".into(), num),
            rate(bo.get("to_rps").unwrap_or(&Value::Null))
        ),
        None => "unknown".into(),
    }
}

fn collectors_table(collectors: &Value, now: u64) -> String {
    let list = collectors["collectors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if list.is_empty() {
        return "collectors: none configured\n".into();
    }
    let mut rows = Vec::new();
    for c in &list {
        let runs: Vec<String> = c["active_runs"]
            .as_array()
            .map(|runs| {
                runs.iter()
                    .map(|r| {
                        let used = r["units"].as_u64().or(r["attempts"].as_u64()).unwrap_or(0);
                        let left = match r["request_cap"].as_u64() {
                            Some(cap) => format!("{} left of {cap}", cap.saturating_sub(used)),
                            None => "no cap".into(),
                        };
                        let deadline =
                            match (r["deadline_s"].as_f64(), r["started_unix_ms"].as_u64()) {
                                (Some(d), Some(start)) => format!(
                                    ", deadline in {}",
                                    span((start as f64 + d * 1000.0 - now as f64).max(0.0))
                                ),
                                _ => String::new(),
                            };
                        format!(
                            "{} {}: {used} used, {left}{deadline}",
                            r["id"].as_str().unwrap_or("?"),
                            r["mode"].as_str().unwrap_or("?")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let last = match c["last_run"].as_object() {
            Some(r) => format!(
                "{}: {}",
                r.get("id").and_then(Value::as_str).unwrap_or("?"),
                r.get("stop_reason")
                    .and_then(Value::as_str)
                    .or(r.get("phase").and_then(Value::as_str))
                    .unwrap_or("?")
            ),
            None => "none".into(),
        };
        rows.push(vec![
            c["name"].as_str().unwrap_or("?").to_string(),
            if runs.is_empty() {
                "none".into()
            } else {
                runs.join("; ")
            },
            last,
            c["pending_gaps"]
                .as_u64()
                .map_or_else(|| "unknown".into(), |n| n.to_string()),
        ]);
    }
    table(
        &["COLLECTOR", "ACTIVE RUNS", "LAST RUN", "PENDING GAPS"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers and spans read as a person would write them.
    #[test]
    fn numbers_are_rounded_for_people() {
        assert_eq!(num(3.849_103_124_999_998_7), "3.85");
        assert_eq!(num(19.923_911), "19.9");
        assert_eq!(num(250.4), "250");
        assert_eq!(num(20.0), "20");
        assert_eq!(num(0.5), "0.5");
        assert_eq!(span(850.0), "850 ms");
        assert_eq!(span(12_400.0), "12.4 s");
        assert_eq!(span(240_000.0), "4 min");
        assert_eq!(span(9_000_000.0), "2.5 h");
    }
}
