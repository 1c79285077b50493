//! sluice: an HTTP forward proxy that keeps data collectors inside each
//! provider's budget. The binary (`main.rs`) is only its command line;
//! this library is the proxy, so that forwarding, tunnels and the edge can
//! be tested without starting a process.
//!
//! One request's way: [`serve`] accepts and authenticates, then hands a
//! CONNECT to [`tunnel`] and an absolute-form request to
//! [`http::forward`]; either way the request goes through its provider's
//! stack (from [`providers`]) to [`upstream`], and any failure is answered
//! by [`http::edge`]. [`app`] holds the shared handles, [`cli::process`]
//! wires them and runs the signals and background tasks, [`observe`]
//! turns events into metrics, logs and evidence, [`store`] keeps what was
//! learned, [`runs`] keeps collectors' runs. The command line's other
//! commands are in [`cli`].
#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod config;
pub mod http;
pub mod observe;
pub mod providers;
pub mod reference;
pub mod runs;
pub mod serve;
pub mod shared;
pub mod store;
pub mod tunnel;
pub mod upstream;
