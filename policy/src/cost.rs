//! What a request costs a provider, in the provider's units (R-FS2).
//!
//! Some providers charge requests unequally — a GraphQL query may cost ten
//! points where a `GET` costs one — and their quota counts points, not
//! requests. A provider's cost table prices a request by method and path
//! prefix before it is sent (`"POST /graphql" = 10`); a provider that says
//! what it charged (a response header such as `x-cost`) corrects the price
//! after the answer. The pacer then spaces units, not requests: a request
//! of ten units takes ten slots. Without a table every request costs one.

/// One price: requests of `method` (any, if `None`) whose path starts with
/// `prefix` cost `units`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostRule {
    /// The method, or any.
    pub method: Option<http::Method>,
    /// The path prefix (`/` for every path).
    pub prefix: String,
    /// What such a request costs, ≥ 1.
    pub units: u32,
}

/// A provider's cost table: the longest matching prefix prices a request
/// (a rule naming the method before one for any method); 1 if none does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Costs {
    rules: Vec<CostRule>,
}

/// The largest price a rule may set: a request that costs more than this
/// many slots would wait minutes for its turn at any usual rate.
pub const MAX_UNITS: u32 = 10_000;

impl Costs {
    /// A table from rules written `"METHOD /prefix"` or `"/prefix"`, or why
    /// not (naming the rule).
    pub fn parse<'a>(rules: impl IntoIterator<Item = (&'a str, u32)>) -> Result<Costs, String> {
        let mut out = Vec::new();
        for (rule, units) in rules {
            let (method, prefix) = match rule.trim().split_once(char::is_whitespace) {
                Some((m, p)) => {
                    let m = http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| format!("{rule:?}: {m:?} is not a method"))?;
                    (Some(m), p.trim())
                }
                None => (None, rule.trim()),
            };
            if !prefix.starts_with('/') {
                return Err(format!(
                    "{rule:?}: write \"METHOD /path-prefix\" or \"/path-prefix\""
                ));
            }
            if units == 0 || units > MAX_UNITS {
                return Err(format!("{rule:?}: a cost is 1 to {MAX_UNITS} units"));
            }
            out.push(CostRule {
                method,
                prefix: prefix.to_string(),
                units,
            });
        }
        Ok(Costs { rules: out })
    }

    /// Whether every request costs one.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// What a request of `method` to `path` costs.
    pub fn of(&self, method: &http::Method, path: &str) -> u32 {
        self.rules
            .iter()
            .filter(|r| {
                r.method.as_ref().is_none_or(|m| m == method) && path.starts_with(&r.prefix)
            })
            .max_by_key(|r| (r.prefix.len(), r.method.is_some()))
            .map_or(1, |r| r.units)
    }
}

/// The units a provider says it charged, from its `header` (a whole
/// number; anything else is no word).
pub fn charged(headers: &http::HeaderMap, header: &http::HeaderName) -> Option<u32> {
    let v = headers.get(header)?.to_str().ok()?.trim();
    let n: f64 = v.parse().ok()?;
    (n.is_finite() && n >= 0.0).then(|| n.ceil().min(f64::from(MAX_UNITS)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_rule_prices_a_request() {
        let c = Costs::parse([
            ("POST /graphql", 10),
            ("/graphql", 2),
            ("/", 1),
            ("get /a/b", 3),
        ])
        .unwrap();
        assert_eq!(c.of(&http::Method::POST, "/graphql"), 10);
        assert_eq!(c.of(&http::Method::GET, "/graphql?q=1"), 2);
        assert_eq!(c.of(&http::Method::GET, "/a/b/c"), 3);
        assert_eq!(c.of(&http::Method::POST, "/a/b/c"), 1);
        assert_eq!(Costs::default().of(&http::Method::POST, "/x"), 1);
        for bad in [
            ("POST graphql", 1),
            ("P@ST /x", 1),
            ("/x", 0),
            ("/x", 10_001),
        ] {
            assert!(Costs::parse([bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_charged_header_is_a_whole_number_or_nothing() {
        let name = http::HeaderName::from_static("x-cost");
        let mut h = http::HeaderMap::new();
        assert_eq!(charged(&h, &name), None);
        h.insert(&name, "12".parse().unwrap());
        assert_eq!(charged(&h, &name), Some(12));
        h.insert(&name, "2.5".parse().unwrap());
        assert_eq!(charged(&h, &name), Some(3));
        h.insert(&name, "lots".parse().unwrap());
        assert_eq!(charged(&h, &name), None);
    }
}
