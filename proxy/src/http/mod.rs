//! One HTTP request through sluice: where it goes ([`forward`]: the
//! target, the headers, the provider's stack, an upgrade), its bodies
//! ([`body`]), the watch on each client stream for a request framed two
//! ways ([`framing`]), and the one place a failure becomes an answer
//! ([`edge`]).

pub mod body;
pub mod edge;
pub mod forward;
pub mod framing;
