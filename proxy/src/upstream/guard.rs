//! The destination guard: sluice is not a way into the private network
//! (R-SF2).
//!
//! A forward proxy that connects wherever it is told is an SSRF gadget:
//! `http://169.254.169.254/` hands out cloud credentials. sluice refuses
//! private, loopback, link-local, CGNAT, multicast and metadata addresses
//! unless the config allows them — and it checks the addresses it will
//! *connect to*, after DNS resolution, so a public name resolving to a
//! private address is refused too. Literal IPs are checked before any
//! connection is made ([`GuardedConnector`]); names are checked in the
//! resolver ([`GuardedResolver`]), so the pooled client can only ever
//! connect to addresses that passed.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use ipnet::IpNet;
use tower::Service;

/// A destination the guard refused, or a name that did not resolve.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GuardError {
    /// Every address of the destination is in a refused range: one of
    /// them, and its class (see [`CLASSES`]). Said as a refusal's details:
    /// the address, why, and the key that allows it.
    #[error(
        "destination address {ip} is {class}, not allowed: list it in destinations.allow (e.g. {})",
        IpNet::from(*ip)
    )]
    Prohibited {
        /// A refused address.
        ip: IpAddr,
        /// Its class.
        class: &'static str,
    },
    /// The name did not resolve.
    #[error("name did not resolve: {0}")]
    Dns(String),
}

/// Every class [`refused_class`] names: the reasons
/// `sluice_destination_refusals_total` counts, beside `connect_port` and
/// `collector_allow`.
pub const CLASSES: [&str; 10] = [
    "loopback",
    "private",
    "metadata",
    "link_local",
    "shared_cgnat",
    "unspecified",
    "protocol_assignment",
    "benchmarking",
    "multicast_or_reserved",
    "nat64",
];

impl GuardError {
    /// Why the guard refused, as a metric's bounded reason; `None` for a
    /// name that did not resolve.
    pub fn class(&self) -> Option<&'static str> {
        match self {
            GuardError::Prohibited { class, .. } => Some(class),
            GuardError::Dns(_) => None,
        }
    }
}

/// The guard's refusal among an error's causes, if one is.
pub fn prohibited_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a GuardError> {
    super::causes::find::<GuardError>(err).filter(|g| matches!(g, GuardError::Prohibited { .. }))
}

/// What class of address an IP is, if a refused one.
pub fn refused_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return v4_class(v4);
            }
            v6_class(v6)
        }
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    Some(match o {
        [127, ..] => "loopback",
        [10, ..] => "private",
        [172, b, ..] if (16..=31).contains(&b) => "private",
        [192, 168, ..] => "private",
        [169, 254, 169, 254] => "metadata",
        [169, 254, ..] => "link_local",
        [100, b, ..] if (64..=127).contains(&b) => "shared_cgnat",
        [0, ..] => "unspecified",
        [192, 0, 0, _] => "protocol_assignment",
        [198, b, ..] if b == 18 || b == 19 => "benchmarking",
        [a, ..] if a >= 224 => "multicast_or_reserved",
        _ => return None,
    })
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(if ip.is_loopback() {
        "loopback"
    } else if ip.is_unspecified() {
        "unspecified"
    } else if s[0] == 0xfd00 && s[1] == 0x0ec2 {
        "metadata"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "private"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "link_local"
    } else if s[0] & 0xff00 == 0xff00 {
        "multicast_or_reserved"
    } else if s[0] == 0x64 && s[1] == 0xff9b {
        // NAT64 may embed any IPv4 address, private ones included.
        "nat64"
    } else {
        return None;
    })
}

/// The destination policy: refused ranges minus the config's exceptions.
///
/// Clones share the exception list, so a config reload reaches the
/// connector inside the pooled client too.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allow: Arc<RwLock<Vec<IpNet>>>,
}

impl Guard {
    /// A guard with these exceptions.
    pub fn new(allow: Vec<IpNet>) -> Self {
        Guard {
            allow: Arc::new(RwLock::new(allow)),
        }
    }

    /// Replaces the exceptions (config reload).
    pub fn set_allow(&self, allow: Vec<IpNet>) {
        *self.allow.write().unwrap_or_else(|p| p.into_inner()) = allow;
    }

    /// Checks one address.
    pub fn check(&self, ip: IpAddr) -> Result<(), GuardError> {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match refused_class(ip) {
            Some(class)
                if !self
                    .allow
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .any(|net| net.contains(&ip)) =>
            {
                Err(GuardError::Prohibited { ip, class })
            }
            _ => Ok(()),
        }
    }

    /// Checks a host that is an IP literal, or `localhost` (or a name
    /// under it, RFC 6761: always the loopback addresses, refused unless
    /// one of them is allowed); other names pass (the resolver checks
    /// them). Refused here, a request never waits for a pacing slot nor
    /// counts as an attempt.
    pub fn check_literal(&self, host: &str) -> Result<(), GuardError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.check(ip);
        }
        let name = bare.trim_end_matches('.').to_ascii_lowercase();
        if name == "localhost" || name.ends_with(".localhost") {
            let v4 = self.check(IpAddr::V4(Ipv4Addr::LOCALHOST));
            if v4.is_ok() || self.check(IpAddr::V6(Ipv6Addr::LOCALHOST)).is_ok() {
                return Ok(());
            }
            return v4;
        }
        Ok(())
    }

    /// Resolves `host:port` and keeps only permitted addresses; none left
    /// is an error.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, GuardError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.check(ip)?;
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| GuardError::Dns(e.kind().to_string()))?
            .collect();
        if found.is_empty() {
            return Err(GuardError::Dns("no addresses".into()));
        }
        let mut refused = None;
        let ok: Vec<_> = found
            .into_iter()
            .filter(|a| match self.check(a.ip()) {
                Ok(()) => true,
                Err(e) => {
                    refused = Some(e);
                    false
                }
            })
            .collect();
        match (ok.is_empty(), refused) {
            (true, Some(e)) => Err(e),
            _ => Ok(ok),
        }
    }
}

/// A DNS resolver that only returns addresses the guard permits.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    guard: Guard,
}

impl Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = GuardError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, GuardError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), GuardError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let guard = self.guard.clone();
        Box::pin(async move {
            // The connector sets the port itself.
            Ok(guard.resolve(name.as_str(), 0).await?.into_iter())
        })
    }
}

/// hyper-util's TCP connector with the guard in front: literal IPs are
/// checked here, names by the [`GuardedResolver`] inside.
#[derive(Debug, Clone)]
pub struct GuardedConnector {
    guard: Guard,
    inner: HttpConnector<GuardedResolver>,
}

impl GuardedConnector {
    /// A connector with this guard and connect timeout.
    pub fn new(guard: Guard, connect_timeout: std::time::Duration) -> Self {
        let mut inner = HttpConnector::new_with_resolver(GuardedResolver {
            guard: guard.clone(),
        });
        inner.enforce_http(false);
        inner.set_nodelay(true);
        inner.set_connect_timeout(Some(connect_timeout));
        GuardedConnector { guard, inner }
    }
}

impl Service<Uri> for GuardedConnector {
    type Response = <HttpConnector<GuardedResolver> as Service<Uri>>::Response;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let checked = self.guard.check_literal(uri.host().unwrap_or(""));
        let fut = self.inner.call(uri);
        Box::pin(async move {
            checked?;
            fut.await.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Classification only: nothing here connects anywhere.
    #[test]
    fn refused_ranges() {
        let cases = [
            ("127.0.0.1", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.255", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("metadata")),
            ("169.254.1.1", Some("link_local")),
            ("100.64.0.1", Some("shared_cgnat")),
            ("0.0.0.0", Some("unspecified")),
            ("224.0.0.1", Some("multicast_or_reserved")),
            ("255.255.255.255", Some("multicast_or_reserved")),
            ("8.8.8.8", None),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("fc00::1", Some("private")),
            ("fd00:ec2::254", Some("metadata")),
            ("fe80::1", Some("link_local")),
            ("::ffff:10.0.0.1", Some("private")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("64:ff9b::a00:1", Some("nat64")),
            ("2606:4700::1111", None),
        ];
        for (ip, want) in cases {
            assert_eq!(refused_class(ip.parse().unwrap()), want, "{ip}");
        }
    }

    #[test]
    fn exceptions_allow_only_their_range() {
        let g = Guard::new(vec!["127.0.0.0/8".parse().unwrap()]);
        assert!(g.check("127.0.0.2".parse().unwrap()).is_ok());
        assert!(g.check("::ffff:127.0.0.2".parse().unwrap()).is_ok());
        assert!(g.check("10.0.0.1".parse().unwrap()).is_err());
        assert!(g.check_literal("[::1]").is_err());
        assert!(g.check_literal("example.com").is_ok());
        let none = Guard::default();
        assert!(matches!(
            none.check_literal("127.0.0.1"),
            Err(GuardError::Prohibited {
                class: "loopback",
                ..
            })
        ));
    }

    /// Issue 36 (defect 1): the refusal names the address, why, and the
    /// key that allows it, with a value to write there.
    #[test]
    fn a_refusal_names_the_address_and_the_key() {
        let none = Guard::default();
        let said = none.check_literal("[::1]").unwrap_err().to_string();
        assert_eq!(
            said,
            "destination address ::1 is loopback, not allowed: list it in destinations.allow (e.g. ::1/128)"
        );
        let said = none
            .check("10.1.2.3".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            said.contains("10.1.2.3 is private") && said.contains("10.1.2.3/32"),
            "{said}"
        );
    }

    /// Issue 36 (defect 2): `localhost` is refused as the loopback it
    /// always is (RFC 6761) before any lookup, and allowed with it.
    #[test]
    fn localhost_is_checked_as_loopback() {
        let none = Guard::default();
        for host in ["localhost", "LOCALHOST.", "api.localhost"] {
            assert!(none.check_literal(host).is_err(), "{host}");
        }
        assert!(none.check_literal("localhost.example.com").is_ok());
        let v4 = Guard::new(vec!["127.0.0.0/8".parse().unwrap()]);
        assert!(v4.check_literal("localhost").is_ok());
        let v6 = Guard::new(vec!["::1/128".parse().unwrap()]);
        assert!(v6.check_literal("localhost").is_ok());
    }

    #[test]
    fn every_class_is_listed() {
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "192.0.0.1",
            "198.18.0.1",
            "224.0.0.1",
            "64:ff9b::1",
        ] {
            let class = refused_class(ip.parse().unwrap()).unwrap();
            assert!(CLASSES.contains(&class), "{class}");
        }
    }
}
