//! Numbers for people, as `sluice status` and the admin page write them
//! (the page's script rounds the same way).

/// Three significant digits, at most two decimals: `3.85`, `19.9`, `250`.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    let a = x.abs();
    let d = if a >= 100.0 {
        0
    } else if a >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{x:.d$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}
