//! The adaptive 3-sigma anomaly detector: a running mean and standard deviation (Welford) per entity
//! and metric; a value more than three standard deviations above the mean of what came before raises
//! an alert, and every value (anomalous or not) is then learned, so the baseline adapts. A series
//! alerts once per episode: further anomalous values raise nothing until one falls back within the
//! threshold (a sustained shift is one alert, not one per request).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, VecDeque};

use brainstorm_proto::policy::{AnomalyAlert, Baseline, MetricStats};

/// Alerts need this many earlier observations: a young baseline says little.
pub const MIN_SAMPLES: u64 = 10;
/// How many standard deviations above the mean is anomalous.
pub const SIGMA_THRESHOLD: f64 = 3.0;
/// A flat baseline uses this share of its mean as its standard deviation, so noise on a constant
/// series does not alert.
const FLAT_STD_DEV_SHARE: f64 = 0.05;
/// Alerts kept per tenant.
pub const MAX_ALERTS: usize = 1000;

/// One entity's metric.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeriesKey {
    pub entity_type: String,
    pub entity_id: String,
    pub metric: String,
}

impl SeriesKey {
    /// The key's parts, borrowed.
    pub fn as_ref(&self) -> SeriesRef<'_> {
        SeriesRef { entity_type: &self.entity_type, entity_id: &self.entity_id, metric: &self.metric }
    }
}

/// A series key borrowed from its parts: known series are found without building a `SeriesKey`
/// (an in-process feed observes several series per request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesRef<'a> {
    pub entity_type: &'a str,
    pub entity_id: &'a str,
    pub metric: &'a str,
}

impl SeriesRef<'_> {
    fn to_key(self) -> SeriesKey {
        SeriesKey { entity_type: self.entity_type.to_string(), entity_id: self.entity_id.to_string(), metric: self.metric.to_string() }
    }
}

/// What the detector's maps are searched by: the three parts, ordered as `SeriesKey` derives its
/// order (field by field), so an owned key and a borrowed one compare alike.
trait SeriesParts {
    fn parts(&self) -> (&str, &str, &str);
}

impl SeriesParts for SeriesKey {
    fn parts(&self) -> (&str, &str, &str) {
        (&self.entity_type, &self.entity_id, &self.metric)
    }
}

impl SeriesParts for SeriesRef<'_> {
    fn parts(&self) -> (&str, &str, &str) {
        (self.entity_type, self.entity_id, self.metric)
    }
}

impl<'a> Borrow<dyn SeriesParts + 'a> for SeriesKey {
    fn borrow(&self) -> &(dyn SeriesParts + 'a) {
        self
    }
}

impl PartialEq for dyn SeriesParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn SeriesParts + '_ {}

impl PartialOrd for dyn SeriesParts + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn SeriesParts + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts().cmp(&other.parts())
    }
}

/// Running statistics of one series.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Welford {
    pub count: u64,
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
    pub min: f64,
    pub max: f64,
}

impl Welford {
    /// Learns one value.
    pub fn push(&mut self, value: f64) {
        if self.count == 0 {
            self.min = value;
            self.max = value;
        } else {
            self.min = self.min.min(value);
            self.max = self.max.max(value);
        }
        self.count += 1;
        let delta = value - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (value - self.mean);
    }

    /// Sample standard deviation (0 below two values).
    pub fn std_dev(&self) -> f64 {
        if self.count < 2 { 0.0 } else { (self.m2 / (self.count - 1) as f64).max(0.0).sqrt() }
    }

    /// The standard deviation alerts are measured in (floored for flat series).
    fn alert_std_dev(&self) -> f64 {
        self.std_dev().max(self.mean.abs() * FLAT_STD_DEV_SHARE).max(f64::EPSILON)
    }

    pub fn stats(&self) -> MetricStats {
        MetricStats { count: self.count, mean: self.mean, std_dev: self.std_dev(), min: self.min, max: self.max }
    }
}

/// One series: its running statistics, and whether its last value was anomalous (an alert was
/// raised for the episode that value belongs to).
#[derive(Debug, Clone, Copy, Default)]
struct Series {
    stats: Welford,
    in_episode: bool,
}

impl Series {
    /// Tests a value against the baseline, then learns it; the alert when it opens an episode.
    fn observe(&mut self, key: SeriesRef<'_>, value: f64, timestamp: &str) -> Option<AnomalyAlert> {
        let stats = &mut self.stats;
        let std_dev = stats.alert_std_dev();
        let sigma = (value - stats.mean) / std_dev;
        let anomalous = stats.count >= MIN_SAMPLES && sigma > SIGMA_THRESHOLD;
        // An alert opens an episode; the episode's later anomalous values raise nothing.
        let alert = (anomalous && !self.in_episode).then(|| AnomalyAlert {
            entity_type: key.entity_type.to_string(),
            entity_id: key.entity_id.to_string(),
            metric: key.metric.to_string(),
            current_value: value,
            threshold: stats.mean + SIGMA_THRESHOLD * std_dev,
            mean: stats.mean,
            std_dev,
            sigma,
            timestamp: timestamp.to_string(),
        });
        self.in_episode = anomalous;
        stats.push(value);
        alert
    }
}

/// One tenant's detector: series baselines and recent alerts.
#[derive(Debug, Default)]
pub struct Detector {
    series: BTreeMap<SeriesKey, Series>,
    alerts: VecDeque<AnomalyAlert>,
}

impl Detector {
    /// Tests a value against its series' baseline, then learns it. Non-finite values are ignored.
    pub fn observe(&mut self, key: SeriesKey, value: f64, timestamp: &str) -> Option<AnomalyAlert> {
        self.observe_ref(key.as_ref(), value, timestamp)
    }

    /// `observe` with a borrowed key: a known series is found by one search without copying its
    /// key, which is built only for a new series or an alert.
    pub fn observe_ref(&mut self, key: SeriesRef<'_>, value: f64, timestamp: &str) -> Option<AnomalyAlert> {
        if !value.is_finite() {
            return None;
        }
        let search: &dyn SeriesParts = &key;
        let alert = match self.series.get_mut(search) {
            Some(series) => series.observe(key, value, timestamp),
            None => self.series.entry(key.to_key()).or_default().observe(key, value, timestamp),
        };
        if let Some(alert) = &alert {
            if self.alerts.len() == MAX_ALERTS {
                self.alerts.pop_front();
            }
            self.alerts.push_back(alert.clone());
        }
        alert
    }

    /// Recent alerts, newest first.
    pub fn alerts(&self, limit: usize) -> Vec<AnomalyAlert> {
        self.alerts.iter().rev().take(limit).cloned().collect()
    }

    /// Alerts at or after an instant (RFC 3339 text compares as time).
    pub fn alerts_since(&self, since: &str) -> usize {
        self.alerts.iter().filter(|alert| alert.timestamp.as_str() >= since).count()
    }

    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    pub fn stats(&self, key: &SeriesKey) -> Option<MetricStats> {
        self.series.get(key).map(|series| series.stats.stats())
    }

    /// Every baseline, for export.
    pub fn baselines(&self) -> Vec<Baseline> {
        self.series
            .iter()
            .map(|(key, series)| Baseline {
                entity_type: key.entity_type.clone(),
                entity_id: key.entity_id.clone(),
                metric: key.metric.clone(),
                count: series.stats.count,
                mean: series.stats.mean,
                m2: series.stats.m2,
                min: series.stats.min,
                max: series.stats.max,
            })
            .collect()
    }

    /// Replaces the baselines given (others stay); returns how many were imported. Invalid baselines
    /// (empty names, no samples, non-finite or negative spread, min above max) are refused.
    pub fn import(&mut self, baselines: &[Baseline]) -> Result<usize, String> {
        for baseline in baselines {
            let finite = [baseline.mean, baseline.m2, baseline.min, baseline.max].iter().all(|value| value.is_finite());
            if baseline.entity_type.is_empty() || baseline.entity_id.is_empty() || baseline.metric.is_empty() {
                return Err("every baseline needs entityType, entityId and metric".to_string());
            }
            if baseline.count == 0 || !finite || baseline.m2 < 0.0 || baseline.min > baseline.max {
                return Err(format!("baseline {}/{}/{} is not a valid summary", baseline.entity_type, baseline.entity_id, baseline.metric));
            }
        }
        for baseline in baselines {
            let key = SeriesKey {
                entity_type: baseline.entity_type.clone(),
                entity_id: baseline.entity_id.clone(),
                metric: baseline.metric.clone(),
            };
            let stats = Welford { count: baseline.count, mean: baseline.mean, m2: baseline.m2, min: baseline.min, max: baseline.max };
            // An imported baseline starts outside any episode: its next anomalous value alerts.
            self.series.insert(key, Series { stats, in_episode: false });
        }
        Ok(baselines.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(metric: &str) -> SeriesKey {
        SeriesKey { entity_type: "agent".to_string(), entity_id: "planner".to_string(), metric: metric.to_string() }
    }

    #[test]
    fn borrowed_and_owned_keys_find_the_same_series() {
        let mut detector = Detector::default();
        // Keys that order differently part by part, so a lookup that compared parts out of order
        // (or hashed instead of ordering) would miss or mix them.
        let keys = [("agent", "b", "cost_usd"), ("agent", "a", "tokens"), ("key", "a", "cost_usd"), ("agent", "a", "cost_usd")];
        for round in 0..12 {
            for (entity_type, entity_id, metric) in keys {
                let value = 10.0 + f64::from(round % 2);
                if round % 2 == 0 {
                    detector.observe_ref(SeriesRef { entity_type, entity_id, metric }, value, "t");
                } else {
                    let owned = SeriesKey { entity_type: entity_type.into(), entity_id: entity_id.into(), metric: metric.into() };
                    detector.observe(owned, value, "t");
                }
            }
        }
        assert_eq!(detector.series_count(), keys.len());
        for (entity_type, entity_id, metric) in keys {
            let owned = SeriesKey { entity_type: entity_type.into(), entity_id: entity_id.into(), metric: metric.into() };
            assert_eq!(detector.stats(&owned).map(|stats| stats.count), Some(12), "{owned:?}");
        }
        // A spike through a borrowed key alerts once per episode, like an owned one.
        let spike = SeriesRef { entity_type: "key", entity_id: "a", metric: "cost_usd" };
        let alert = detector.observe_ref(spike, 1_000.0, "t2");
        assert_eq!(
            alert.map(|alert| (alert.entity_type, alert.entity_id, alert.metric)),
            Some(("key".into(), "a".into(), "cost_usd".into()))
        );
        assert!(detector.observe_ref(spike, 2_000.0, "t3").is_none(), "the same episode");
    }

    fn learned(values: &[f64]) -> Detector {
        let mut detector = Detector::default();
        for value in values {
            assert!(detector.observe(key("cost_usd"), *value, "2026-01-01T00:00:00.000Z").is_none());
        }
        detector
    }

    #[test]
    fn running_statistics_are_exact() {
        let detector = learned(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        let Some(stats) = detector.stats(&key("cost_usd")) else { unreachable!("observed") };
        assert_eq!((stats.count, stats.mean, stats.min, stats.max), (8, 5.0, 2.0, 9.0));
        assert!((stats.std_dev - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert!(detector.stats(&key("tokens")).is_none());
    }

    #[test]
    fn a_value_beyond_three_sigma_alerts_and_is_learned() {
        let values = [10.0, 11.0, 9.0, 10.0, 12.0, 8.0, 10.0, 11.0, 9.0, 10.0];
        let mut detector = learned(&values);
        let before = detector.stats(&key("cost_usd")).unwrap_or_default();
        assert!(detector.observe(key("cost_usd"), 13.0, "t1").is_none(), "within three sigma");
        let Some(alert) = detector.observe(key("cost_usd"), 40.0, "t2") else { unreachable!("40 is far above") };
        assert!(alert.sigma > 3.0);
        assert!(alert.threshold < 40.0 && alert.threshold > before.mean);
        assert_eq!((alert.entity_type.as_str(), alert.metric.as_str(), alert.current_value), ("agent", "cost_usd", 40.0));
        assert_eq!(detector.stats(&key("cost_usd")).map(|stats| stats.count), Some(12), "the anomaly is learned too");
        assert_eq!(detector.alerts(10).len(), 1);
        assert_eq!(detector.alerts_since("t2"), 1);
        assert_eq!(detector.alerts_since("t3"), 0);
    }

    #[test]
    fn a_sustained_shift_alerts_once_per_episode() {
        let mut detector = learned(&[10.0, 11.0, 9.0, 10.0, 12.0, 8.0, 10.0, 11.0, 9.0, 10.0]);
        assert!(detector.observe(key("cost_usd"), 40.0, "t1").is_some(), "the shift opens an episode");
        assert!(detector.observe(key("cost_usd"), 45.0, "t2").is_none(), "still the same episode");
        assert!(detector.observe(key("tokens"), 1.0, "t2").is_none(), "other series are separate");
        assert!(detector.observe(key("cost_usd"), 10.0, "t3").is_none(), "back within the threshold: the episode ends");
        assert!(detector.observe(key("cost_usd"), 400.0, "t4").is_some(), "a new spike is a new episode");
        assert_eq!(detector.alerts(10).len(), 2);
    }

    #[test]
    fn an_imported_baseline_starts_outside_any_episode() -> Result<(), String> {
        let mut detector = learned(&[10.0, 11.0, 9.0, 10.0, 12.0, 8.0, 10.0, 11.0, 9.0, 10.0]);
        assert!(detector.observe(key("cost_usd"), 40.0, "t1").is_some(), "the shift opens an episode");
        let baselines = detector.baselines();
        detector.import(&baselines)?;
        assert_eq!(detector.stats(&key("cost_usd")).map(|stats| stats.count), Some(11), "the import kept the statistics");
        assert!(detector.observe(key("cost_usd"), 400.0, "t2").is_some(), "after an import, a spike alerts again");
        Ok(())
    }

    #[test]
    fn young_or_flat_baselines_do_not_alert_on_noise() {
        let mut young = learned(&[1.0, 1.0, 1.0]);
        assert!(young.observe(key("cost_usd"), 1000.0, "t").is_none(), "fewer than ten samples");
        let mut flat = learned(&[100.0; 12]);
        assert!(flat.observe(key("cost_usd"), 101.0, "t").is_none(), "1% above a flat series is noise");
        assert!(flat.observe(key("cost_usd"), 200.0, "t").is_some());
        let mut drop = learned(&[10.0, 11.0, 9.0, 10.0, 12.0, 8.0, 10.0, 11.0, 9.0, 10.0]);
        assert!(drop.observe(key("cost_usd"), 0.0, "t").is_none(), "only rises alert");
    }

    #[test]
    fn baselines_export_and_import() -> Result<(), String> {
        let source = learned(&[10.0, 11.0, 9.0, 10.0, 12.0, 8.0, 10.0, 11.0, 9.0, 10.0]);
        let exported = source.baselines();
        let mut target = Detector::default();
        assert_eq!(target.import(&exported)?, 1);
        assert_eq!(target.stats(&key("cost_usd")), source.stats(&key("cost_usd")));
        assert!(target.observe(key("cost_usd"), 40.0, "t").is_some(), "an imported baseline alerts at once");
        let mut invalid = exported[0].clone();
        invalid.count = 0;
        assert!(target.import(&[invalid]).is_err());
        Ok(())
    }
}
