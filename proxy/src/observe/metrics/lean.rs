//! Families labelled by provider, kept lean (R-OP1, R-PF1, issue 38).
//!
//! The `prometheus` crate's vectors give each series its own copy of its
//! family's description — name, help text, label names — and its label
//! pairs as owned strings: some 700 bytes a counter, 1.5 KB a histogram.
//! A provider's first request makes some 25 series (most of them zeroes,
//! so that `increase()` sees a first event) and each scrape sets some 20
//! gauges; with 256 providers holding labels that was ~20 KB each, 5 MB
//! (a third of a kilobyte per host of a 10,000-host crawl, measured: the
//! same crawl with one label). Here a family keeps its description once
//! and a series its label values and its number: 100–300 bytes. The families
//! are registered in the same registry and written by the same encoder,
//! so `/metrics` reads the same (a test compares the two byte for byte).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

/// What one series holds: a number, or a histogram's buckets.
pub trait Cell: Send + Sync + 'static {
    /// Its family's type.
    const KIND: MetricType;
    /// A series at zero; `bounds` are a histogram's buckets.
    fn zero(bounds: &Arc<[f64]>) -> Self;
    /// Writes its value into `m`.
    fn fill(&self, m: &mut proto::Metric);
}

/// A whole-number counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Cell for Counter {
    const KIND: MetricType = MetricType::COUNTER;

    fn zero(_: &Arc<[f64]>) -> Self {
        Counter::default()
    }

    fn fill(&self, m: &mut proto::Metric) {
        let mut c = proto::Counter::default();
        c.set_value(self.get() as f64);
        m.set_counter(c);
    }
}

/// A counter of fractions (seconds), its `f64` kept as bits.
#[derive(Debug, Default)]
pub struct FloatCounter(AtomicU64);

impl FloatCounter {
    pub fn inc_by(&self, v: f64) {
        add_f64(&self.0, v);
    }
}

impl Cell for FloatCounter {
    const KIND: MetricType = MetricType::COUNTER;

    fn zero(_: &Arc<[f64]>) -> Self {
        FloatCounter::default()
    }

    fn fill(&self, m: &mut proto::Metric) {
        let mut c = proto::Counter::default();
        c.set_value(f64::from_bits(self.0.load(Relaxed)));
        m.set_counter(c);
    }
}

/// A level that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Relaxed);
    }
}

impl Cell for Gauge {
    const KIND: MetricType = MetricType::GAUGE;

    fn zero(_: &Arc<[f64]>) -> Self {
        Gauge::default()
    }

    fn fill(&self, m: &mut proto::Metric) {
        let mut g = proto::Gauge::default();
        g.set_value(f64::from_bits(self.0.load(Relaxed)));
        m.set_gauge(g);
    }
}

/// A whole-number level (a count, a state, a flag).
#[derive(Debug, Default)]
pub struct IntGauge(AtomicI64);

impl IntGauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Relaxed);
    }
}

impl Cell for IntGauge {
    const KIND: MetricType = MetricType::GAUGE;

    fn zero(_: &Arc<[f64]>) -> Self {
        IntGauge::default()
    }

    fn fill(&self, m: &mut proto::Metric) {
        let mut g = proto::Gauge::default();
        g.set_value(self.0.load(Relaxed) as f64);
        m.set_gauge(g);
    }
}

/// A histogram: a count per bucket (the last one past every bound) and
/// the sum. Its count is the buckets' total as read, so the two never
/// disagree in one scrape.
#[derive(Debug)]
pub struct Histogram {
    bounds: Arc<[f64]>,
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, v: f64) {
        let at = self.bounds.partition_point(|b| *b < v);
        self.buckets[at].fetch_add(1, Relaxed);
        add_f64(&self.sum, v);
    }
}

impl Cell for Histogram {
    const KIND: MetricType = MetricType::HISTOGRAM;

    fn zero(bounds: &Arc<[f64]>) -> Self {
        Histogram {
            bounds: bounds.clone(),
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    fn fill(&self, m: &mut proto::Metric) {
        let mut h = proto::Histogram::default();
        let mut count = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (bound, n) in self.bounds.iter().zip(self.buckets.iter()) {
            count += n.load(Relaxed);
            let mut b = proto::Bucket::default();
            b.set_cumulative_count(count);
            b.set_upper_bound(*bound);
            buckets.push(b);
        }
        count += self.buckets.last().map_or(0, |n| n.load(Relaxed));
        h.set_bucket(buckets);
        h.set_sample_count(count);
        h.set_sample_sum(f64::from_bits(self.sum.load(Relaxed)));
        m.set_histogram(h);
    }
}

/// Adds `v` to the `f64` kept as bits in `cell`.
fn add_f64(cell: &AtomicU64, v: f64) {
    let _ = cell.fetch_update(Relaxed, Relaxed, |bits| {
        Some((f64::from_bits(bits) + v).to_bits())
    });
}

/// One family: its description once, its series by their label values.
pub struct LeanVec<C: Cell>(Arc<Family<C>>);

impl<C: Cell> Clone for LeanVec<C> {
    fn clone(&self) -> Self {
        LeanVec(self.0.clone())
    }
}

impl<C: Cell> std::fmt::Debug for LeanVec<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LeanVec")
            .field(&self.0.desc.fq_name)
            .finish()
    }
}

/// The providers whose series start at zero (see [`Zeros`]): those a
/// first request named, until they leave the table.
pub type Zeroed = Arc<Mutex<BTreeSet<Box<str>>>>;

/// Series a family shows at zero for every provider in `providers`
/// until they count something (so that `increase()` sees a first event),
/// without keeping them: `combos` are the values of its other labels, in
/// the family's order. Some 20 of a provider's series are such zeroes;
/// kept, they were 2.7 KB in 37 allocations of each labelled provider.
pub struct Zeros {
    pub providers: Zeroed,
    pub combos: Vec<Vec<&'static str>>,
}

struct Family<C> {
    desc: Desc,
    /// What it shows at zero without keeping it.
    zeros: Option<Zeros>,
    /// A histogram's bucket bounds (empty for the others).
    bounds: Arc<[f64]>,
    /// The label names' positions in name order: how a series' pairs are
    /// written, as the `prometheus` crate sorts them.
    order: Box<[usize]>,
    /// Where the `provider` label is, if the family has one.
    provider_at: Option<usize>,
    /// Series by a hash of their label values; those whose hashes collide
    /// are chained.
    series: RwLock<HashMap<u64, Series<C>>>,
}

struct Series<C> {
    /// Its label values in one allocation, each followed by [`END`].
    values: Box<[u8]>,
    cell: Arc<C>,
    next: Option<Box<Series<C>>>,
}

/// What ends each label value in [`Series::values`]: a byte no UTF-8
/// text holds.
const END: u8 = 0xFF;

/// `values` in one allocation (see [`Series::values`]).
fn joined(values: &[&str]) -> Box<[u8]> {
    let mut out = Vec::with_capacity(values.iter().map(|v| v.len() + 1).sum());
    for v in values {
        out.extend_from_slice(v.as_bytes());
        out.push(END);
    }
    out.into()
}

impl<C> Series<C> {
    /// Its label values, in the family's order.
    fn values(&self) -> impl Iterator<Item = &str> {
        self.values
            .split_inclusive(|b| *b == END)
            .map(|v| std::str::from_utf8(&v[..v.len() - 1]).unwrap_or_default())
    }

    fn is(&self, values: &[&str]) -> bool {
        self.values().eq(values.iter().copied())
    }

    fn find(&self, values: &[&str]) -> Option<&Series<C>> {
        let mut at = Some(self);
        while let Some(s) = at {
            if s.is(values) {
                return Some(s);
            }
            at = s.next.as_deref();
        }
        None
    }
}

/// What is left of a chain once the series `gone` names are dropped.
fn pruned<C>(mut s: Series<C>, gone: &dyn Fn(&Series<C>) -> bool) -> Option<Series<C>> {
    let rest = s.next.take().and_then(|n| pruned(*n, gone));
    if gone(&s) {
        rest
    } else {
        s.next = rest.map(Box::new);
        Some(s)
    }
}

fn hash(values: &[&str]) -> u64 {
    let mut h = DefaultHasher::new();
    values.hash(&mut h);
    h.finish()
}

impl<C: Cell> LeanVec<C> {
    /// A family `name` (the registry adds `sluice_`) with `help` and
    /// `labels`.
    pub fn new(name: &str, help: &str, labels: &[&str]) -> Self {
        Self::with_buckets(name, help, labels, Vec::new())
    }

    /// A histogram family with `bounds`.
    pub fn with_buckets(name: &str, help: &str, labels: &[&str], bounds: Vec<f64>) -> Self {
        Self::build(name, help, labels, bounds, None)
    }

    /// A family that shows `zeros` (it must have a `provider` label).
    pub fn with_zeros(name: &str, help: &str, labels: &[&str], zeros: Zeros) -> Self {
        assert!(
            labels.contains(&"provider"),
            "{name}: zeros are a provider's"
        );
        Self::build(name, help, labels, Vec::new(), Some(zeros))
    }

    fn build(
        name: &str,
        help: &str,
        labels: &[&str],
        bounds: Vec<f64>,
        zeros: Option<Zeros>,
    ) -> Self {
        let desc = Desc::new(
            name.into(),
            help.into(),
            labels.iter().map(|l| (*l).into()).collect(),
            HashMap::new(),
        )
        .expect("valid metric");
        let mut order: Vec<usize> = (0..labels.len()).collect();
        order.sort_by_key(|i| labels[*i]);
        LeanVec(Arc::new(Family {
            desc,
            zeros,
            bounds: bounds.into(),
            order: order.into(),
            provider_at: labels.iter().position(|l| *l == "provider"),
            series: RwLock::new(HashMap::new()),
        }))
    }

    /// The series of `values` (one per label, in the family's order),
    /// made at zero if it is new.
    pub fn with_label_values(&self, values: &[&str]) -> Arc<C> {
        assert_eq!(
            values.len(),
            self.0.desc.variable_labels.len(),
            "{}: one value per label",
            self.0.desc.fq_name
        );
        let h = hash(values);
        let read = self.0.series.read().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = read.get(&h).and_then(|s| s.find(values)) {
            return s.cell.clone();
        }
        drop(read);
        let mut series = self.0.series.write().unwrap_or_else(|p| p.into_inner());
        let new = || Series {
            values: joined(values),
            cell: Arc::new(C::zero(&self.0.bounds)),
            next: None,
        };
        let mut at = series.entry(h).or_insert_with(new);
        loop {
            if at.is(values) {
                return at.cell.clone();
            }
            at = at.next.get_or_insert_with(|| Box::new(new()));
        }
    }

    /// Removes every series.
    pub fn reset(&self) {
        self.0
            .series
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Removes the series of the providers `gone`.
    pub fn forget(&self, gone: &HashSet<&str>) {
        let Some(at) = self.0.provider_at else {
            return;
        };
        let mut series = self.0.series.write().unwrap_or_else(|p| p.into_inner());
        let is_gone = |s: &Series<C>| s.values().nth(at).is_some_and(|v| gone.contains(v));
        *series = std::mem::take(&mut *series)
            .into_iter()
            .filter_map(|(h, s)| pruned(s, &is_gone).map(|s| (h, s)))
            .collect();
    }

    fn metric(&self, s: &Series<C>) -> proto::Metric {
        let values: Vec<&str> = s.values().collect();
        self.metric_of(&values, &s.cell)
    }

    fn metric_of(&self, values: &[&str], cell: &C) -> proto::Metric {
        let labels = self
            .0
            .order
            .iter()
            .map(|i| {
                let mut pair = LabelPair::default();
                pair.set_name(self.0.desc.variable_labels[*i].clone());
                pair.set_value(values.get(*i).copied().unwrap_or_default().to_string());
                pair
            })
            .collect();
        let mut m = proto::Metric::from_label(labels);
        cell.fill(&mut m);
        m
    }

    /// The zeroes to show: each zeroed provider's combinations it has no
    /// series of.
    fn zeroes(&self, series: &HashMap<u64, Series<C>>, out: &mut Vec<proto::Metric>) {
        let (Some(zeros), Some(at)) = (&self.0.zeros, self.0.provider_at) else {
            return;
        };
        // Taken while the series are read, never the other way round:
        // `Metrics::forget` lets go of it before it removes any series.
        let providers = zeros.providers.lock().unwrap_or_else(|p| p.into_inner());
        let zero = C::zero(&self.0.bounds);
        for provider in providers.iter() {
            for combo in &zeros.combos {
                let mut values: Vec<&str> = combo.clone();
                values.insert(at.min(values.len()), provider);
                let kept = series
                    .get(&hash(&values))
                    .and_then(|s| s.find(&values))
                    .is_some();
                if !kept {
                    out.push(self.metric_of(&values, &zero));
                }
            }
        }
    }
}

impl<C: Cell> Collector for LeanVec<C> {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut family = MetricFamily::default();
        family.set_name(self.0.desc.fq_name.clone());
        family.set_help(self.0.desc.help.clone());
        family.set_field_type(C::KIND);
        let series = self.0.series.read().unwrap_or_else(|p| p.into_inner());
        let mut metrics = Vec::with_capacity(series.len());
        for head in series.values() {
            let mut at = Some(head);
            while let Some(s) = at {
                metrics.push(self.metric(s));
                at = s.next.as_deref();
            }
        }
        self.zeroes(&series, &mut metrics);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{
        CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec,
        Opts, Registry, TextEncoder,
    };

    fn text(r: &Registry) -> String {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    }

    fn registry() -> Registry {
        Registry::new_custom(Some("sluice".into()), None).unwrap()
    }

    /// R-OP1: each kind of lean family, fed the same as the `prometheus`
    /// crate's vector of that kind, writes the same text — names, help,
    /// types, label order (sorted by name), values, buckets — and a
    /// provider forgotten leaves both the same way.
    #[test]
    fn lean_families_read_as_the_crates_own() {
        let (ours, theirs) = (registry(), registry());
        let labels = &["provider", "from", "to"];
        let counter = LeanVec::<Counter>::new("moves_total", "Moves", labels);
        let their_counter = IntCounterVec::new(Opts::new("moves_total", "Moves"), labels).unwrap();
        let secs = LeanVec::<FloatCounter>::new("held_seconds_total", "Held", &["provider"]);
        let their_secs =
            CounterVec::new(Opts::new("held_seconds_total", "Held"), &["provider"]).unwrap();
        let gauge = LeanVec::<Gauge>::new("rate_rps", "Rate", &["provider"]);
        let their_gauge = GaugeVec::new(Opts::new("rate_rps", "Rate"), &["provider"]).unwrap();
        let level = LeanVec::<IntGauge>::new("state", "State", &["provider", "state"]);
        let their_level =
            IntGaugeVec::new(Opts::new("state", "State"), &["provider", "state"]).unwrap();
        let bounds = prometheus::exponential_buckets(0.001, 2.0, 16).unwrap();
        let hist = LeanVec::<Histogram>::with_buckets(
            "wait_seconds",
            "Wait",
            &["provider"],
            bounds.clone(),
        );
        let their_hist = HistogramVec::new(
            HistogramOpts::new("wait_seconds", "Wait").buckets(bounds),
            &["provider"],
        )
        .unwrap();
        ours.register(Box::new(counter.clone())).unwrap();
        ours.register(Box::new(secs.clone())).unwrap();
        ours.register(Box::new(gauge.clone())).unwrap();
        ours.register(Box::new(level.clone())).unwrap();
        ours.register(Box::new(hist.clone())).unwrap();
        theirs.register(Box::new(their_counter.clone())).unwrap();
        theirs.register(Box::new(their_secs.clone())).unwrap();
        theirs.register(Box::new(their_gauge.clone())).unwrap();
        theirs.register(Box::new(their_level.clone())).unwrap();
        theirs.register(Box::new(their_hist.clone())).unwrap();
        assert_eq!(text(&ours), text(&theirs), "empty families are left out");

        for (p, n) in [("a.test", 3), ("b.test", 1), ("_other", 7)] {
            counter.with_label_values(&[p, "closed", "open"]).inc_by(n);
            their_counter
                .with_label_values(&[p, "closed", "open"])
                .inc_by(n);
            counter.with_label_values(&[p, "open", "half_open"]);
            their_counter.with_label_values(&[p, "open", "half_open"]);
            secs.with_label_values(&[p]).inc_by(n as f64 * 0.25);
            their_secs.with_label_values(&[p]).inc_by(n as f64 * 0.25);
            gauge.with_label_values(&[p]).set(n as f64 / 3.0);
            their_gauge.with_label_values(&[p]).set(n as f64 / 3.0);
            level.with_label_values(&[p, "shared"]).set(n as i64 - 2);
            their_level
                .with_label_values(&[p, "shared"])
                .set(n as i64 - 2);
            for v in [0.0005, 0.001, 0.0011, 0.3, 7.0, 40.0, 1e9] {
                for _ in 0..n {
                    hist.with_label_values(&[p]).observe(v);
                    their_hist.with_label_values(&[p]).observe(v);
                }
            }
        }
        let fed = text(&ours);
        assert_eq!(fed, text(&theirs));
        assert!(
            fed.contains("sluice_moves_total{from=\"closed\",provider=\"a.test\",to=\"open\"} 3"),
            "{fed}"
        );

        let gone: HashSet<&str> = ["a.test"].into();
        counter.forget(&gone);
        secs.forget(&gone);
        gauge.forget(&gone);
        level.forget(&gone);
        hist.forget(&gone);
        for values in [
            ["a.test", "closed", "open"],
            ["a.test", "open", "half_open"],
        ] {
            their_counter.remove_label_values(&values).unwrap();
        }
        their_secs.remove_label_values(&["a.test"]).unwrap();
        their_gauge.remove_label_values(&["a.test"]).unwrap();
        their_level
            .remove_label_values(&["a.test", "shared"])
            .unwrap();
        their_hist.remove_label_values(&["a.test"]).unwrap();
        let left = text(&ours);
        assert_eq!(left, text(&theirs));
        assert!(
            !left.contains("a.test") && left.contains("b.test"),
            "{left}"
        );

        gauge.reset();
        their_gauge.reset();
        assert_eq!(text(&ours), text(&theirs));
    }

    /// R-OP1: a family's zeroes read as the series the `prometheus` crate
    /// keeps at zero from a provider's first request — before it counts,
    /// once it counts some of them, and after it is forgotten — while
    /// only the provider's name is kept.
    #[test]
    fn zeroes_read_as_series_kept_at_zero() {
        let (ours, theirs) = (registry(), registry());
        let labels = &["provider", "from", "to"];
        let combos = [["closed", "open"], ["open", "half_open"]];
        let zeroed = Zeroed::default();
        let lean = LeanVec::<Counter>::with_zeros(
            "moves_total",
            "Moves",
            labels,
            Zeros {
                providers: zeroed.clone(),
                combos: combos.iter().map(|c| c.to_vec()).collect(),
            },
        );
        let theirs_vec = IntCounterVec::new(Opts::new("moves_total", "Moves"), labels).unwrap();
        ours.register(Box::new(lean.clone())).unwrap();
        theirs.register(Box::new(theirs_vec.clone())).unwrap();
        for p in ["a.test", "b.test"] {
            zeroed.lock().unwrap().insert(p.into());
            for [from, to] in combos {
                theirs_vec.with_label_values(&[p, from, to]);
            }
        }
        let zero = text(&ours);
        assert_eq!(zero, text(&theirs));
        assert!(
            zero.contains(
                "sluice_moves_total{from=\"open\",provider=\"b.test\",to=\"half_open\"} 0"
            ),
            "{zero}"
        );
        assert!(lean.0.series.read().unwrap().is_empty(), "no zero is kept");

        lean.with_label_values(&["a.test", "closed", "open"])
            .inc_by(2);
        theirs_vec
            .with_label_values(&["a.test", "closed", "open"])
            .inc_by(2);
        // A combination outside the zeroes, and a provider without them.
        lean.with_label_values(&["c.test", "open", "closed"]).inc();
        theirs_vec
            .with_label_values(&["c.test", "open", "closed"])
            .inc();
        assert_eq!(text(&ours), text(&theirs));

        zeroed.lock().unwrap().remove("a.test");
        lean.forget(&["a.test"].into());
        for [from, to] in combos {
            theirs_vec
                .remove_label_values(&["a.test", from, to])
                .unwrap();
        }
        let left = text(&ours);
        assert_eq!(left, text(&theirs));
        assert!(!left.contains("a.test"), "{left}");
    }

    /// Series whose label values hash alike are chained, each its own:
    /// found again, counted apart, and forgotten one without the other.
    #[test]
    fn series_that_collide_stay_apart() {
        let vec = LeanVec::<Counter>::new("hits_total", "Hits", &["provider"]);
        // Two series forced onto one hash, as a collision would put them.
        let h = hash(&["a"]);
        {
            let mut series = vec.0.series.write().unwrap();
            let b = Series {
                values: joined(&["b"]),
                cell: Arc::new(Counter::default()),
                next: None,
            };
            series.insert(
                h,
                Series {
                    values: joined(&["a"]),
                    cell: Arc::new(Counter::default()),
                    next: Some(Box::new(b)),
                },
            );
        }
        let series = vec.0.series.read().unwrap();
        let head = series.get(&h).unwrap();
        head.find(&["b"]).unwrap().cell.inc_by(2);
        head.find(&["a"]).unwrap().cell.inc();
        assert!(head.find(&["c"]).is_none());
        drop(series);
        vec.forget(&["a"].into());
        let series = vec.0.series.read().unwrap();
        let head = series.get(&h).expect("b stays under the shared hash");
        assert!(head.is(&["b"]));
        assert_eq!(head.cell.get(), 2);
        assert!(head.next.is_none());
    }
}
