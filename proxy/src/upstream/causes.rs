//! Finding one kind of error among an upstream failure's causes.

use std::error::Error;

/// The first error of type `T` among `err` and its causes: walks
/// `source()` and the inner error of an `io::Error` (which does not
/// expose it as its source: tokio-rustls keeps a handshake's
/// `rustls::Error` there).
pub fn find<'a, T: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut next = vec![err];
    while let Some(e) = next.pop() {
        if let Some(t) = e.downcast_ref::<T>() {
            return Some(t);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            next.push(inner);
        }
        if let Some(src) = e.source() {
            next.push(src);
        }
    }
    None
}
