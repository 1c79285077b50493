//! Test support for sluice's end-to-end tests: a provider simulator, a
//! harness that runs the real `sluice` binary, and real clients (curl,
//! Python requests) configured only by environment; and simulated providers
//! and in-client pacers on the paused clock for the pacer's bench and
//! convergence tests.
#![forbid(unsafe_code)]

pub mod answers;
pub mod clients;
pub mod discord;
pub mod flask_limiter;
pub mod github;
pub mod haproxy;
pub mod harness;
pub mod hosts;
pub mod load;
pub mod model;
pub mod nginx;
pub mod openai;
pub mod pki;
pub mod procfs;
pub mod redis;
pub mod saas;
pub mod sim;
pub mod squid;
