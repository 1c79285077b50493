//! Finding one kind of error among an upstream failure's causes.

use std::error::Error;

/// `err` and its causes, depth first: `source()` and the inner error of
/// an `io::Error` (which does not expose it as its source: tokio-rustls
/// keeps a handshake's `rustls::Error` there).
pub fn chain<'a>(
    err: &'a (dyn Error + 'static),
) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    let mut next = vec![err];
    std::iter::from_fn(move || {
        let e = next.pop()?;
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            next.push(inner);
        }
        if let Some(src) = e.source() {
            next.push(src);
        }
        Some(e)
    })
}

/// The first error of type `T` among `err` and its causes ([`chain`]).
pub fn find<'a, T: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a T> {
    chain(err).find_map(|e| e.downcast_ref::<T>())
}
