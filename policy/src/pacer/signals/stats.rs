//! The statistics behind the evidence: tails of the Poisson and binomial
//! distributions and the two-rate test, in closed forms good enough for a
//! p-value threshold.

/// A count of errors is significant when a baseline this likely or less
/// would have produced it (one-sided Poisson tail). Small, because the
/// question is asked at every error: at 1 % a noisy provider at 200 req/s
/// would see a false alarm every minute or so.
pub const SIGNIFICANCE: f64 = 0.001;

/// Answers and errors over some span: 32-bit floats, whole to 2²⁴ and
/// decayed sums well within their precision — six of them and a band
/// each are kept by every answered provider (R-PF1, issue 38).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Count {
    /// Answers of any kind.
    pub answers: f32,
    /// Ambiguous errors among them.
    pub errors: f32,
}

impl Count {
    pub(super) fn add(&mut self, error: bool) {
        self.answers += 1.0;
        if error {
            self.errors += 1.0;
        }
    }

    /// The counts in 64-bit floats.
    pub fn wide(&self) -> Wide {
        Wide {
            answers: f64::from(self.answers),
            errors: f64::from(self.errors),
        }
    }

    /// The error share, if anything was seen.
    pub fn share(&self) -> Option<f64> {
        (self.answers > 0.0).then(|| f64::from(self.errors) / f64::from(self.answers))
    }
}

/// A [`Count`] in 64-bit floats: sums of counts, and the tests' input.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Wide {
    /// Answers of any kind.
    pub answers: f64,
    /// Ambiguous errors among them.
    pub errors: f64,
}

impl Wide {
    /// Adds `c`'s counts.
    pub fn add(&mut self, c: &Count) {
        self.answers += f64::from(c.answers);
        self.errors += f64::from(c.errors);
    }
}

/// The p-value of "errors are more frequent in `high` than in `low`":
/// the conditional test for two Poisson rates — given all the errors seen,
/// how likely are at least this many to have fallen on the high side if
/// both sides shared one rate? Neither side's rate is taken as known, so a
/// few lucky error-free answers at a low rate prove nothing.
pub fn rate_test(low: Wide, high: Wide) -> f64 {
    let k = (low.errors + high.errors).round();
    let x = high.errors.round();
    let n = low.answers + high.answers;
    if x <= 0.0 || n <= 0.0 {
        return 1.0;
    }
    binomial_tail(x as u64, k as u64, high.answers / n)
}

/// P(X ≥ x) for X ~ Binomial(n, q).
pub fn binomial_tail(x: u64, n: u64, q: f64) -> f64 {
    if x == 0 {
        return 1.0;
    }
    if x > n || q <= 0.0 {
        return 0.0;
    }
    if q >= 1.0 {
        return 1.0;
    }
    if n > 200 {
        let mu = n as f64 * q;
        let z = (x as f64 - 0.5 - mu) / (mu * (1.0 - q)).sqrt();
        return 0.5 * erfc(z / std::f64::consts::SQRT_2);
    }
    // Sum the pmf from x up, in log space for the binomial coefficient.
    let (lq, lp) = (q.ln(), (1.0 - q).ln());
    let mut total = 0.0;
    let mut log_choose: f64 = (0..x).map(|i| ((n - i) as f64 / (i + 1) as f64).ln()).sum();
    for i in x..=n {
        total += (log_choose + i as f64 * lq + (n - i) as f64 * lp).exp();
        log_choose += ((n - i) as f64 / (i + 1) as f64).ln();
    }
    total.min(1.0)
}

/// P(K ≤ k) for K ~ Poisson(mu).
pub fn poisson_below(k: f64, mu: f64) -> f64 {
    1.0 - poisson_tail(k.floor() + 1.0, mu)
}

/// P(K ≥ k) for K ~ Poisson(mu).
pub fn poisson_tail(k: f64, mu: f64) -> f64 {
    if k <= 0.0 {
        return 1.0;
    }
    if mu <= 0.0 {
        return 0.0;
    }
    if mu > 50.0 {
        // Normal approximation with continuity correction.
        let z = (k - 0.5 - mu) / mu.sqrt();
        return 0.5 * erfc(z / std::f64::consts::SQRT_2);
    }
    let k = k.ceil() as u64;
    let mut term = (-mu).exp();
    let mut below = 0.0;
    for i in 0..k {
        below += term;
        term *= mu / (i + 1) as f64;
    }
    (1.0 - below).max(0.0)
}

/// The complementary error function (Numerical Recipes' `erfcc`, relative
/// error below 1.2e-7 — plenty for a significance test).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_tail_matches_known_values() {
        assert_eq!(poisson_tail(0.0, 3.0), 1.0);
        assert_eq!(poisson_tail(1.0, 0.0), 0.0);
        assert!((poisson_tail(1.0, 1.0) - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
        // P(K >= 2 | mu = 0.5) = 1 - e^-0.5 (1 + 0.5)
        assert!((poisson_tail(2.0, 0.5) - (1.0 - (-0.5f64).exp() * 1.5)).abs() < 1e-12);
        // The normal branch is close to the exact sum near the switch.
        let exact = {
            let mut term = (-50.0f64).exp();
            let mut below = 0.0;
            for i in 0..70 {
                below += term;
                term *= 50.0 / (i + 1) as f64;
            }
            1.0 - below
        };
        assert!((poisson_tail(70.0, 50.000_001) - exact).abs() < 0.005);
    }

    #[test]
    fn binomial_tail_matches_known_values() {
        assert_eq!(binomial_tail(0, 5, 0.5), 1.0);
        assert!((binomial_tail(5, 5, 0.5) - 1.0 / 32.0).abs() < 1e-12);
        assert!((binomial_tail(4, 5, 0.5) - 6.0 / 32.0).abs() < 1e-12);
        let exact = binomial_tail(120, 200, 0.5);
        let approx = binomial_tail(120, 201, 0.5);
        assert!((exact - approx).abs() < 0.01, "{exact} {approx}");
        // Four errors in 29 answers against none in 50: not proof.
        let low = Wide {
            answers: 50.0,
            errors: 0.0,
        };
        let high = Wide {
            answers: 29.0,
            errors: 4.0,
        };
        assert!(rate_test(low, high) > SIGNIFICANCE);
        // Five in 30 against none in 300: proof.
        let low = Wide {
            answers: 300.0,
            errors: 0.0,
        };
        let high = Wide {
            answers: 30.0,
            errors: 5.0,
        };
        assert!(rate_test(low, high) < SIGNIFICANCE);
    }
}
