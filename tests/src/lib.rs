//! Test support for sluice's end-to-end tests: a provider simulator, a
//! harness that runs the real `sluice` binary, and real clients (curl,
//! Python requests) configured only by environment.
#![forbid(unsafe_code)]

pub mod clients;
pub mod harness;
pub mod pki;
pub mod sim;
