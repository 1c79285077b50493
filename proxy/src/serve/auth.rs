//! Proxy credentials (R-SF1): who a collector is, and whether it may use
//! sluice at all.
//!
//! Collectors put credentials in their proxy URL
//! (`HTTP_PROXY=http://collector-a:token@127.0.0.1:3128`); clients send
//! them as `Proxy-Authorization: Basic`. When the config lists
//! credentials, every request and CONNECT must carry a valid pair; the
//! identity travels with the request (runs use it later). The header never
//! reaches the provider and never appears in a log.
//!
//! A collector with a steady and a catch-up run active at once (R-FS1)
//! says which run a request is for by its user: `collector-a+catchup` (or
//! `+steady`) with the collector's own token; `sluice run` sets it.

use std::collections::HashMap;

use base64::Engine;
use http::header::PROXY_AUTHORIZATION;
use http::HeaderMap;

use crate::runs::records::Mode;

pub use crate::serve::identity::Identity;

/// The proxy credentials were missing, or not accepted. One rule: once
/// the config names any proxy user (`[auth] credentials` or a collector's
/// token), every request must carry a valid pair — loopback clients too;
/// with none named, nobody needs one. Each says so, and what to send; a
/// wrong one never says whether the user or the token was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// No `Proxy-Authorization` at all.
    #[error(
        "proxy credentials required: this sluice names its users ([auth] credentials or [collectors]), \
         so every client sends one; put it in the proxy URL: http://USER:TOKEN@HOST:PORT"
    )]
    Missing,
    /// One was sent, and is not a configured user's pair (or not Basic).
    #[error(
        "proxy credentials not accepted: unknown user or wrong token \
         (Basic USER:TOKEN of [auth] credentials or a collector's token_file)"
    )]
    Rejected,
}

/// Checks `Proxy-Authorization` against the configured credentials.
/// `Ok(Identity::anonymous())` when none are configured.
pub fn authenticate(
    headers: &HeaderMap,
    credentials: &HashMap<String, String>,
) -> Result<Identity, Unauthenticated> {
    if credentials.is_empty() {
        return Ok(Identity::anonymous());
    }
    use Unauthenticated::Rejected;
    let value = headers
        .get(PROXY_AUTHORIZATION)
        .ok_or(Unauthenticated::Missing)?
        .to_str()
        .map_err(|_| Rejected)?;
    let (scheme, encoded) = value.trim().split_once(' ').ok_or(Rejected)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(Rejected);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| Rejected)?;
    let text = String::from_utf8(decoded).map_err(|_| Rejected)?;
    let (user, token) = text.split_once(':').ok_or(Rejected)?;
    let (user, mode) = match credentials.contains_key(user) {
        true => (user, None),
        false => {
            let (name, mode) = user.rsplit_once('+').ok_or(Rejected)?;
            (name, Some(Mode::parse(mode).ok_or(Rejected)?))
        }
    };
    let expected = credentials.get(user).ok_or(Rejected)?;
    if constant_time_eq(expected.as_bytes(), token.as_bytes()) {
        Ok(Identity {
            user: Some(user.to_string()),
            mode,
        })
    } else {
        Err(Rejected)
    }
}

/// Whether two byte strings are equal, in time that does not depend on
/// where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> HashMap<String, String> {
        HashMap::from([("collector-a".to_string(), "s3cret".to_string())])
    }

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(PROXY_AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn basic_credentials() {
        let ok = base64::engine::general_purpose::STANDARD.encode("collector-a:s3cret");
        assert_eq!(
            authenticate(&with(&format!("Basic {ok}")), &creds()),
            Ok(Identity::user("collector-a"))
        );
        // The run mode rides on the user, with the collector's own token.
        for (user, mode) in [
            ("collector-a+catchup", Mode::Catchup),
            ("collector-a+steady", Mode::Steady),
        ] {
            let ok = base64::engine::general_purpose::STANDARD.encode(format!("{user}:s3cret"));
            assert_eq!(
                authenticate(&with(&format!("Basic {ok}")), &creds()),
                Ok(Identity {
                    user: Some("collector-a".into()),
                    mode: Some(mode),
                })
            );
        }
        for bad in [
            "collector-a+backfill:s3cret",
            "collector-a+catchup:wrong",
            "collector-b+catchup:s3cret",
            "+catchup:s3cret",
        ] {
            let bad = base64::engine::general_purpose::STANDARD.encode(bad);
            assert!(authenticate(&with(&format!("Basic {bad}")), &creds()).is_err());
        }
        let bad = base64::engine::general_purpose::STANDARD.encode("collector-a:wrong");
        assert!(authenticate(&with(&format!("Basic {bad}")), &creds()).is_err());
        assert!(authenticate(&with("Bearer x"), &creds()).is_err());
        assert!(authenticate(&with("Basic !!!"), &creds()).is_err());
        assert!(authenticate(&HeaderMap::new(), &creds()).is_err());
        assert_eq!(
            authenticate(&HeaderMap::new(), &HashMap::new()),
            Ok(Identity::anonymous())
        );
    }

    /// Issue 36, defect 3: a missing pair and a wrong one say different
    /// things — the rule and where the pair goes, or that it was not
    /// accepted (never which half was wrong).
    #[test]
    fn missing_and_wrong_credentials_say_different_things() {
        let missing = authenticate(&HeaderMap::new(), &creds()).unwrap_err();
        assert_eq!(missing, Unauthenticated::Missing);
        let said = missing.to_string();
        assert!(
            said.contains("required") && said.contains("http://USER:TOKEN@"),
            "{said}"
        );
        for bad in ["collector-a:wrong", "nobody:s3cret"] {
            let bad = base64::engine::general_purpose::STANDARD.encode(bad);
            let wrong = authenticate(&with(&format!("Basic {bad}")), &creds()).unwrap_err();
            assert_eq!(wrong, Unauthenticated::Rejected);
            assert!(wrong.to_string().contains("not accepted"));
        }
        assert_eq!(
            authenticate(&with("Bearer x"), &creds()),
            Err(Unauthenticated::Rejected)
        );
    }
}
