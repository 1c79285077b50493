//! An OpenAI-like provider, written from OpenAI's documentation ("Rate
//! limits", "Error codes", the Chat Completions reference) — not from
//! sluice's code.
//!
//! What the documentation says, and this model does:
//! * Two budgets a minute, requests (RPM) and tokens (TPM), replenished
//!   continuously ("quantized": a per-minute limit is enforced over short
//!   periods), each a bucket as large as a minute's worth.
//! * A request is charged at once its estimated tokens: the prompt's
//!   characters over four, plus `max_tokens` (or `max_completion_tokens`)
//!   for each of its `n` choices ("your rate limit is calculated as the
//!   maximum of max_tokens and the estimated number of tokens based on the
//!   character count of your request").
//! * Every answer carries `x-ratelimit-limit-{requests,tokens}`,
//!   `x-ratelimit-remaining-{requests,tokens}` and
//!   `x-ratelimit-reset-{requests,tokens}` — the time until the budget is
//!   whole again, as a Go duration (`1s`, `6m0s`, `12ms`).
//! * Over either budget: `429` `rate_limit_exceeded` ("Rate limit reached
//!   for … on tokens per min (TPM): Limit 120000, Used …, Requested ….
//!   Please try again in 350ms.") with `retry-after-ms`; a request larger
//!   than the whole tokens budget: `429` "Request too large".
//! * A success is a chat completion with its `usage`.

use std::time::Duration;

use tokio::time::Instant;

use crate::sim::{Model, ModelAnswer};

/// One request as the model judged it.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    /// When it arrived.
    pub at: Instant,
    /// The tokens it was charged (or would have been).
    pub tokens: u64,
    /// Whether it was served.
    pub served: bool,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    size: f64,
    level: f64,
}

impl Bucket {
    fn refill(&mut self, per_s: f64, elapsed: Duration) {
        self.level = (self.level + per_s * elapsed.as_secs_f64()).min(self.size);
    }
}

/// The model.
#[derive(Debug)]
pub struct OpenAi {
    rpm: u64,
    tpm: u64,
    requests: Bucket,
    tokens: Bucket,
    at: Option<Instant>,
    /// Every request.
    pub judged: Vec<Judged>,
}

impl OpenAi {
    /// A provider allowing `rpm` requests and `tpm` tokens a minute.
    pub fn new(rpm: u64, tpm: u64) -> OpenAi {
        OpenAi {
            rpm,
            tpm,
            requests: Bucket {
                size: rpm as f64,
                level: rpm as f64,
            },
            tokens: Bucket {
                size: tpm as f64,
                level: tpm as f64,
            },
            at: None,
            judged: Vec::new(),
        }
    }

    /// Tokens served in `[from, to)` after the first request, and the
    /// requests refused there and all of them.
    pub fn served(&self, from: Duration, to: Duration) -> (u64, usize, usize) {
        let Some(t0) = self.judged.first().map(|j| j.at) else {
            return (0, 0, 0);
        };
        let of: Vec<_> = self
            .judged
            .iter()
            .filter(|j| j.at >= t0 + from && j.at < t0 + to)
            .collect();
        let tokens = of.iter().filter(|j| j.served).map(|j| j.tokens).sum();
        let refused = of.iter().filter(|j| !j.served).count();
        (tokens, refused, of.len())
    }
}

/// A duration as Go's `time.Duration.String()` writes it.
pub fn go(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let trim = |secs: f64| {
        let s = format!("{secs:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        return format!("{}s", trim(secs));
    }
    let minutes = (secs / 60.0).floor();
    format!("{}m{}s", minutes as u64, trim(secs - minutes * 60.0))
}

/// The tokens a chat completion request is charged before it runs.
fn estimate(body: &[u8]) -> Option<(u64, u64, u64)> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let chars: usize = v["messages"]
        .as_array()?
        .iter()
        .filter_map(|m| m["content"].as_str())
        .map(str::len)
        .sum();
    let prompt = (chars as u64).div_ceil(4);
    let max = v["max_completion_tokens"]
        .as_u64()
        .or(v["max_tokens"].as_u64())
        .unwrap_or(16);
    let n = v["n"].as_u64().unwrap_or(1).max(1);
    Some((prompt, max, prompt + max * n))
}

impl Model for OpenAi {
    fn service(&self) -> Duration {
        Duration::from_millis(20)
    }

    fn answer(
        &mut self,
        method: &http::Method,
        path: &str,
        body: &[u8],
        _: usize,
        now: Instant,
    ) -> ModelAnswer {
        if method != http::Method::POST || !path.starts_with("/v1/chat/completions") {
            return (404, vec![], r#"{"error":{"message":"Unknown request URL","type":"invalid_request_error","param":null,"code":"unknown_url"}}"#.into());
        }
        let Some((prompt, max, cost)) = estimate(body) else {
            return (400, vec![], r#"{"error":{"message":"We could not parse the JSON body of your request.","type":"invalid_request_error","param":null,"code":null}}"#.into());
        };
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at);
            self.requests.refill(self.rpm as f64 / 60.0, elapsed);
            self.tokens.refill(self.tpm as f64 / 60.0, elapsed);
        }
        self.at = Some(now);
        let too_large = cost > self.tpm;
        let short_requests = self.requests.level < 1.0;
        let short_tokens = self.tokens.level < cost as f64;
        let served = !too_large && !short_requests && !short_tokens;
        if served {
            self.requests.level -= 1.0;
            self.tokens.level -= cost as f64;
        }
        self.judged.push(Judged {
            at: now,
            tokens: cost,
            served,
        });
        let until_whole = |b: &Bucket, per_minute: u64| {
            Duration::from_secs_f64((b.size - b.level) / (per_minute as f64 / 60.0))
        };
        let mut headers = vec![
            ("x-ratelimit-limit-requests", self.rpm.to_string()),
            ("x-ratelimit-limit-tokens", self.tpm.to_string()),
            (
                "x-ratelimit-remaining-requests",
                (self.requests.level.floor() as u64).to_string(),
            ),
            (
                "x-ratelimit-remaining-tokens",
                (self.tokens.level.floor() as u64).to_string(),
            ),
            (
                "x-ratelimit-reset-requests",
                go(until_whole(&self.requests, self.rpm)),
            ),
            (
                "x-ratelimit-reset-tokens",
                go(until_whole(&self.tokens, self.tpm)),
            ),
            ("content-type", "application/json".into()),
        ];
        if served {
            let completion = max.min(prompt / 2 + 1);
            let body = format!(
                r#"{{"id":"chatcmpl-1","object":"chat.completion","created":1800000000,"model":"gpt-4o-mini","choices":[{{"index":0,"message":{{"role":"assistant","content":"ok","refusal":null}},"logprobs":null,"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{}}}}}"#,
                prompt + completion
            );
            return (200, headers, body);
        }
        if too_large {
            return (
                429,
                headers,
                format!(
                    r#"{{"error":{{"message":"Request too large for gpt-4o-mini in organization org-test on tokens per min (TPM): Limit {}, Requested {cost}. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}}}"#,
                    self.tpm
                ),
            );
        }
        let (kind, wait) = if short_requests {
            (
                "requests per min (RPM)",
                (1.0 - self.requests.level) / (self.rpm as f64 / 60.0),
            )
        } else {
            (
                "tokens per min (TPM)",
                (cost as f64 - self.tokens.level) / (self.tpm as f64 / 60.0),
            )
        };
        let wait = Duration::from_secs_f64(wait.max(0.001));
        headers.push(("retry-after-ms", wait.as_millis().max(1).to_string()));
        (
            429,
            headers,
            format!(
                r#"{{"error":{{"message":"Rate limit reached for gpt-4o-mini in organization org-test on {kind}: Limit {}, Used {}, Requested {cost}. Please try again in {}. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}}}"#,
                self.tpm,
                self.tpm - self.tokens.level.floor() as u64,
                go(wait)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_as_go_writes_them() {
        assert_eq!(go(Duration::from_millis(12)), "12ms");
        assert_eq!(go(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go(Duration::from_secs(360)), "6m0s");
        assert_eq!(go(Duration::from_millis(61_250)), "1m1.25s");
    }
}
