//! The command line's work beyond parsing it (`main.rs`): the proxy
//! process itself ([`process`]: wiring, listeners, signals, the
//! background tasks), `sluice run` ([`run`]: a collector's command inside
//! a run) and `sluice status` ([`status`]: the readout for terminals).

pub mod process;
pub mod run;
pub mod status;
