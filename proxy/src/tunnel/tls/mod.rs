//! TLS interception with sluice's own CA (R-PX2, interception half).
//!
//! Almost every provider is HTTPS. Through a plain CONNECT tunnel sluice
//! sees neither status codes nor `Retry-After`, and one keep-alive tunnel
//! carries many requests past a single admission — so for HTTPS the pacer,
//! the breaker and the retry budget would be blind. With interception,
//! sluice terminates the client's TLS with a leaf certificate it mints for
//! the CONNECT host (signed by its own CA, which the collector trusts), and
//! every request inside goes through the provider's stack exactly like
//! plain HTTP. Upstream, sluice opens its own TLS connection, verified
//! against the web roots plus the configured extra CA — never an
//! "insecure" default (R-PX3).
//!
//! The CA itself is [`crate::tunnel::tls::ca`]; its key is written with mode 0600 and
//! never logged (R-SF4).

pub mod ca;
mod intercept;

pub use intercept::intercept;
