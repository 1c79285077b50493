//! Host names and the patterns that match them.

use super::*;

/// A host pattern: `api.example.com` or `*.example.com` (any subdomain,
/// not the apex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This host exactly.
    Exact(String),
    /// Any host ending in `.suffix`.
    Suffix(String),
}

impl std::fmt::Display for HostPattern {
    /// As written in the config: `api.example.com`, `*.example.com`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Suffix(s) => write!(f, "*.{s}"),
        }
    }
}

impl HostPattern {
    pub(super) fn parse(p: &str) -> Result<Self, String> {
        let p = normalise_host(p).into_owned();
        if p.is_empty() {
            return Err("an empty host pattern".into());
        }
        if let Some(rest) = p.strip_prefix("*.") {
            if rest.is_empty() || rest.contains('*') {
                return Err(format!(
                    "{p:?}: a wildcard is only allowed as a leading \"*.\""
                ));
            }
            return Ok(HostPattern::Suffix(rest.to_string()));
        }
        if p.contains('*') || p.contains('/') || p.contains(' ') {
            return Err(format!("{p:?} is not a host name"));
        }
        Ok(HostPattern::Exact(p))
    }

    /// Whether a normalised host matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => h == host,
            HostPattern::Suffix(s) => {
                host.len() > s.len() + 1
                    && host.ends_with(s.as_str())
                    && host.as_bytes()[host.len() - s.len() - 1] == b'.'
            }
        }
    }
}

/// The port an authority (`host[:port]`, no userinfo) writes, if any: what
/// follows its last `:` outside an IPv6 literal's brackets. One scan from
/// the end — `Authority::port_u16` searches the string each call, and a
/// request asked it four times (R-PF1, issue 38).
pub fn written_port(authority: &str) -> Option<&str> {
    let bytes = authority.as_bytes();
    for i in (0..bytes.len()).rev() {
        match bytes[i] {
            b':' => return Some(&authority[i + 1..]),
            b']' => return None,
            _ => {}
        }
    }
    None
}

/// A written port as a number: decimal digits only (RFC 3986's `port =
/// *DIGIT`; `str::parse` would take a sign too), at most 65535. Read digit
/// by digit — a request reads its port three times, and the generic parse
/// cost about a hundred instructions each (R-PF1, issue 38).
pub fn port_number(written: &str) -> Option<u16> {
    if written.is_empty() || written.len() > 5 {
        return None;
    }
    let mut n: u32 = 0;
    for b in written.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u32::from(b - b'0');
    }
    u16::try_from(n).ok()
}

/// The port an authority writes, as a number, if it writes a valid one.
pub fn port_of(authority: &str) -> Option<u16> {
    written_port(authority).and_then(port_number)
}

/// The authority without its port, if the port it writes is `port` (a
/// scheme's default: `host:443` for https is `host`).
pub fn without_port(authority: &str, port: u16) -> Option<&str> {
    let written = written_port(authority)?;
    (port_number(written) == Some(port)).then(|| &authority[..authority.len() - written.len() - 1])
}

/// The bytes of a host that is normal as written: lower-case letters,
/// digits, `.` and `-` — one look-up a byte.
const PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        plain[b] = c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-';
        b += 1;
    }
    plain
};

/// Lower case, no trailing dot, no IPv6 brackets. Borrowed when the host
/// already is (almost every request: issue 24 counted two copies a
/// request) — found in one look at its bytes when it is a plain name or
/// an IPv4 address (R-PF1, issue 38: four trims and a scan took ~190
/// instructions, twice a request).
pub fn normalise_host(host: &str) -> Cow<'_, str> {
    if !host.ends_with('.') && host.bytes().all(|b| PLAIN[usize::from(b)]) {
        return Cow::Borrowed(host);
    }
    let bare = host
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.');
    if bare.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(bare.to_ascii_lowercase())
    } else {
        Cow::Borrowed(bare)
    }
}
