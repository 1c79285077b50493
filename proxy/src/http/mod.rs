//! One HTTP request through sluice: through its provider's stack
//! ([`forward`]), to where it goes ([`target`]), with the headers sluice
//! changes ([`headers`]) and an upgrade joined on `101` (`upgrade`); its
//! bodies ([`body`]), the watch on each client stream for a request framed
//! two ways ([`framing`]), and the one place a failure becomes an answer
//! ([`edge`]).

pub mod body;
pub mod edge;
pub mod forward;
pub mod framing;
pub mod headers;
pub mod target;
mod upgrade;
