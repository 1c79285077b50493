//! sluice: an HTTP forward proxy that keeps data collectors inside each
//! provider's budget. The binary (`main.rs`) is only its command line;
//! this library is the proxy, so that forwarding, tunnels and the edge can
//! be tested without starting a process.
//!
//! One request's way: [`serve`] accepts and authenticates, then hands a
//! CONNECT to [`tunnel`] and an absolute-form request to [`forward`];
//! either way the request goes through its provider's stack (from
//! [`providers`]) to [`upstream`], and any failure is answered by
//! [`edge`]. [`app`] holds the shared handles, [`process`] wires them and
//! runs the signals and background tasks, [`observe`] turns events into
//! metrics, logs and evidence, [`store`] keeps what was learned.
#![forbid(unsafe_code)]

pub mod app;
pub mod body;
pub mod ca;
pub mod config;
pub mod edge;
pub mod forward;
pub mod framing;
pub mod identity;
pub mod observe;
pub mod process;
pub mod providers;
pub mod runner;
pub mod runs;
pub mod serve;
pub mod shared;
pub mod status;
pub mod store;
pub mod tunnel;
pub mod upstream;
