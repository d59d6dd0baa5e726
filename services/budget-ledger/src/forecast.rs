//! Spend forecasts from the ledger's daily totals. Money stays in integer nano-dollars; only the
//! statistics that are not money (confidence, sigma) use floats.
//!
//! Formulas, with `t` now and all days UTC:
//! - Window: the 30 days ending today. `daysOfData` D = the days from the first day of the window with
//!   any settlement through today (0 without any). `daily_spent_usd` lists those D days, zero-filled.
//! - History H = those days except today (complete days); n = D - 1.
//! - Average A (`avgDailySpendUsd`) = sum(H) / n (integer division) when n >= 1; with no complete day
//!   yet, today's spend stands for a day's.
//! - Projection of a period ending at E: `P = spent_in_period + A * (E - t) / 1 day` (i128, floored).
//!   `projectedPeriodSpendUsd` is the current month's P; alerts use the day's P for the daily limit and
//!   the month's P for the monthly limit.
//! - Depletion, against the binding limit L (monthly when set, else the effective daily limit) with
//!   spend S in its period: if S >= L, today (0 days remaining); else if A = 0, none; else the instant
//!   `t + (L - S) / A days`, reported (date, whole days from today) only when it falls before E, since
//!   the limit resets with the next period.
//! - Trend (n >= 4, else `stable`): h = n / 2; compare the last h days of H to the first h: `increasing`
//!   when recent * 10 > older * 11 (10% up), `decreasing` when recent * 10 < older * 9, else `stable`.
//! - Confidence = min(n, 14) / 14 * 1 / (1 + cv), cv = standard deviation / mean of H (0 when the mean
//!   is 0); 0 when n = 0; rounded to two decimals. More and steadier history, more confidence.
//! - Anomalies (n >= 7): a day x (today included) whose spend exceeds the mean m of the other complete
//!   days by more than 3 standard deviations s, with s floored at m / 10 and one nano-dollar (so a
//!   flat history still flags a spike); `sigma` = (x - m) / s.

use chrono::{DateTime, Duration, NaiveDate, Utc};

/// How many days of history a forecast reads.
pub const HISTORY_DAYS: i64 = 30;
const SECONDS_PER_DAY: i128 = 86_400;
const ANOMALY_MIN_HISTORY: usize = 7;
const TREND_MIN_HISTORY: usize = 4;
const CONFIDENCE_FULL_HISTORY: usize = 14;

/// A spend trend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trend {
    Increasing,
    Decreasing,
    Stable,
}

impl Trend {
    /// `increasing`, `decreasing` or `stable`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trend::Increasing => "increasing",
            Trend::Decreasing => "decreasing",
            Trend::Stable => "stable",
        }
    }
}

/// A day that spent far above the others.
#[derive(Debug, Clone, PartialEq)]
pub struct SpendAnomaly {
    pub date: NaiveDate,
    pub spent_nanos: i64,
    pub expected_nanos: i64,
    pub sigma: f64,
}

/// What a forecast is computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForecastInput {
    pub now: DateTime<Utc>,
    /// Spend of the days with settlements in the window (any order; other days count as zero).
    pub daily: Vec<(NaiveDate, i64)>,
    /// Spend of the current month so far (the window may not reach back to the 1st).
    pub month_to_date_nanos: i64,
    /// The effective daily limit (plan cap and tenant limit).
    pub daily_limit_nanos: Option<i64>,
    pub monthly_limit_nanos: Option<i64>,
}

/// A computed forecast.
#[derive(Debug, Clone, PartialEq)]
pub struct ForecastResult {
    /// From the first day of data through today, zero-filled, today last.
    pub series: Vec<(NaiveDate, i64)>,
    pub avg_daily_nanos: i64,
    pub projected_day_nanos: i64,
    pub projected_month_nanos: i64,
    /// Depletion date and whole days from today.
    pub depletion: Option<(NaiveDate, i64)>,
    pub trend: Trend,
    pub confidence: f64,
    pub anomalies: Vec<SpendAnomaly>,
}

/// Computes a forecast (see the module docs for every formula).
pub fn forecast(input: &ForecastInput) -> ForecastResult {
    let today = input.now.date_naive();
    let series = zero_filled_series(today, &input.daily);
    let today_spent = series.last().map_or(0, |(_, spent)| *spent);
    let history: Vec<i64> = series.iter().rev().skip(1).rev().map(|(_, spent)| *spent).collect();
    let avg_daily = if history.is_empty() { today_spent } else { sum(&history) / len_i64(&history) };

    let day_end = crate::period::Period::Daily.end_after(input.now);
    let month_end = crate::period::Period::Monthly.end_after(input.now);
    let projected_day = project(today_spent, avg_daily, input.now, day_end);
    let projected_month = project(input.month_to_date_nanos, avg_daily, input.now, month_end);

    let binding = match (input.monthly_limit_nanos, input.daily_limit_nanos) {
        (Some(monthly), _) => Some((monthly, input.month_to_date_nanos, month_end)),
        (None, Some(daily)) => Some((daily, today_spent, day_end)),
        (None, None) => None,
    };
    let depletion = binding.and_then(|(limit, spent, end)| depletion(limit, spent, avg_daily, input.now, end));

    ForecastResult {
        avg_daily_nanos: avg_daily,
        projected_day_nanos: projected_day,
        projected_month_nanos: projected_month,
        depletion,
        trend: trend(&history),
        confidence: confidence(&history),
        anomalies: anomalies(&series, &history),
        series,
    }
}

/// `spent + average * (end - now) / 1 day`, floored, saturating.
pub fn project(spent: i64, avg_daily: i64, now: DateTime<Utc>, end: DateTime<Utc>) -> i64 {
    let seconds_left = i128::from((end - now).num_seconds().max(0));
    let added = i128::from(avg_daily.max(0)) * seconds_left / SECONDS_PER_DAY;
    i64::try_from(i128::from(spent) + added).unwrap_or(i64::MAX)
}

fn depletion(limit: i64, spent: i64, avg_daily: i64, now: DateTime<Utc>, end: DateTime<Utc>) -> Option<(NaiveDate, i64)> {
    let today = now.date_naive();
    if spent >= limit {
        return Some((today, 0));
    }
    if avg_daily <= 0 {
        return None;
    }
    let seconds = (i128::from(limit) - i128::from(spent)) * SECONDS_PER_DAY / i128::from(avg_daily);
    let at = now + Duration::seconds(i64::try_from(seconds).ok()?);
    if at >= end {
        return None;
    }
    let date = at.date_naive();
    Some((date, (date - today).num_days()))
}

fn zero_filled_series(today: NaiveDate, daily: &[(NaiveDate, i64)]) -> Vec<(NaiveDate, i64)> {
    let window_start = today - Duration::days(HISTORY_DAYS - 1);
    let first = daily.iter().map(|(date, _)| *date).filter(|date| *date >= window_start && *date <= today).min();
    let Some(first) = first else {
        return Vec::new();
    };
    first
        .iter_days()
        .take_while(|date| *date <= today)
        .map(|date| {
            let spent = daily.iter().filter(|(day, _)| *day == date).map(|(_, spent)| *spent).fold(0i64, i64::saturating_add);
            (date, spent)
        })
        .collect()
}

fn trend(history: &[i64]) -> Trend {
    if history.len() < TREND_MIN_HISTORY {
        return Trend::Stable;
    }
    let half = history.len() / 2;
    let older = i128::from(sum(&history[..half]));
    let recent = i128::from(sum(&history[history.len() - half..]));
    if recent * 10 > older * 11 {
        Trend::Increasing
    } else if recent * 10 < older * 9 {
        Trend::Decreasing
    } else {
        Trend::Stable
    }
}

fn confidence(history: &[i64]) -> f64 {
    if history.is_empty() {
        return 0.0;
    }
    let (mean, deviation) = mean_and_deviation(history.iter().copied());
    let variation = if mean > 0.0 { deviation / mean } else { 0.0 };
    let coverage = history.len().min(CONFIDENCE_FULL_HISTORY) as f64 / CONFIDENCE_FULL_HISTORY as f64;
    (coverage / (1.0 + variation) * 100.0).round() / 100.0
}

fn anomalies(series: &[(NaiveDate, i64)], history: &[i64]) -> Vec<SpendAnomaly> {
    if history.len() < ANOMALY_MIN_HISTORY {
        return Vec::new();
    }
    series
        .iter()
        .enumerate()
        .filter_map(|(index, (date, spent))| {
            // The other complete days (today is never part of the history).
            let others = history.iter().enumerate().filter(|(other, _)| *other != index).map(|(_, spent)| *spent);
            let (mean, deviation) = mean_and_deviation(others);
            let deviation = deviation.max(mean / 10.0).max(1.0);
            let sigma = (*spent as f64 - mean) / deviation;
            (sigma > 3.0).then(|| SpendAnomaly {
                date: *date,
                spent_nanos: *spent,
                expected_nanos: mean.round() as i64,
                sigma: (sigma * 100.0).round() / 100.0,
            })
        })
        .collect()
}

fn mean_and_deviation(values: impl Iterator<Item = i64>) -> (f64, f64) {
    let values: Vec<f64> = values.map(|value| value as f64).collect();
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let count = values.len() as f64;
    let mean = values.iter().sum::<f64>() / count;
    let variance = values.iter().map(|value| (value - mean).powi(2)).sum::<f64>() / count;
    (mean, variance.sqrt())
}

fn sum(values: &[i64]) -> i64 {
    values.iter().fold(0i64, |total, value| total.saturating_add(*value))
}

fn len_i64(values: &[i64]) -> i64 {
    i64::try_from(values.len()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const USD: i64 = 1_000_000_000;

    fn at(text: &str) -> DateTime<Utc> {
        brainstorm_common::time::parse_timestamp(text).unwrap_or_default()
    }

    fn date(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").unwrap_or_default()
    }

    /// `spends[i]` on the day `days_before_today - i` before `now`'s date.
    fn daily(now: DateTime<Utc>, spends: &[i64]) -> Vec<(NaiveDate, i64)> {
        let today = now.date_naive();
        let count = i64::try_from(spends.len()).unwrap_or(0);
        spends.iter().enumerate().map(|(index, spent)| (today - Duration::days(count - 1 - index as i64), *spent)).collect()
    }

    #[test]
    fn no_data_forecasts_nothing() {
        let now = at("2026-11-22T12:00:00Z");
        let input =
            ForecastInput { now, daily: Vec::new(), month_to_date_nanos: 0, daily_limit_nanos: Some(2 * USD), monthly_limit_nanos: None };
        let result = forecast(&input);
        assert!(result.series.is_empty());
        assert_eq!((result.avg_daily_nanos, result.projected_month_nanos, result.depletion), (0, 0, None));
        assert_eq!((result.trend, result.confidence), (Trend::Stable, 0.0));
    }

    #[test]
    fn a_steady_history_projects_the_month_and_its_depletion() {
        // Ten complete days at USD 1, today USD 0.5 by noon; monthly limit USD 30 with 20.5 spent.
        let now = at("2026-11-22T12:00:00Z");
        let mut spends = vec![USD; 10];
        spends.push(USD / 2);
        let input = ForecastInput {
            now,
            daily: daily(now, &spends),
            month_to_date_nanos: 20 * USD + USD / 2,
            daily_limit_nanos: Some(5 * USD),
            monthly_limit_nanos: Some(30 * USD),
        };
        let result = forecast(&input);
        assert_eq!(result.series.len(), 11);
        assert_eq!(result.series.first().map(|(day, _)| *day), Some(date("2026-11-12")));
        assert_eq!(result.avg_daily_nanos, USD);
        // 8.5 days left in November: 20.5 + 8.5 = 29.
        assert_eq!(result.projected_month_nanos, 29 * USD);
        assert_eq!(result.projected_day_nanos, USD);
        // 9.5 dollars left at 1 a day: 9.5 days from noon on the 22nd is midnight on Dec 2: past the month.
        assert_eq!(result.depletion, None);
        assert_eq!(result.trend, Trend::Stable);
        assert!((result.confidence - 10.0 / 14.0).abs() < 0.01, "{}", result.confidence);
        assert!(result.anomalies.is_empty());

        let tighter = ForecastInput { monthly_limit_nanos: Some(25 * USD), ..input.clone() };
        // 4.5 dollars left: 4.5 days from noon on the 22nd is midnight starting the 27th.
        assert_eq!(forecast(&tighter).depletion, Some((date("2026-11-27"), 5)));
        let spent = ForecastInput { monthly_limit_nanos: Some(20 * USD), ..input };
        assert_eq!(forecast(&spent).depletion, Some((date("2026-11-22"), 0)));
    }

    #[test]
    fn without_a_monthly_limit_the_daily_limit_binds_within_the_day() {
        let now = at("2026-11-22T18:00:00Z");
        let input = ForecastInput {
            now,
            daily: daily(now, &[4 * USD, 4 * USD, 3 * USD]),
            month_to_date_nanos: 11 * USD,
            daily_limit_nanos: Some(5 * USD),
            monthly_limit_nanos: None,
        };
        let result = forecast(&input);
        // 3 spent, 4 a day: 2 left lasts 12 h, past midnight.
        assert_eq!(result.depletion, None);
        assert_eq!(result.projected_day_nanos, 4 * USD);
        let faster = ForecastInput { daily: daily(now, &[16 * USD, 16 * USD, 3 * USD]), ..input };
        // 2 left at 16 a day: 3 h, before midnight.
        assert_eq!(forecast(&faster).depletion, Some((date("2026-11-22"), 0)));
    }

    #[test]
    fn trends_compare_the_recent_half_with_the_older_half() {
        let now = at("2026-11-22T00:00:00Z");
        let with = |spends: &[i64]| {
            let mut spends = spends.to_vec();
            spends.push(0);
            forecast(&ForecastInput {
                now,
                daily: daily(now, &spends),
                month_to_date_nanos: 0,
                daily_limit_nanos: None,
                monthly_limit_nanos: None,
            })
        };
        assert_eq!(with(&[USD, USD, 2 * USD, 2 * USD]).trend, Trend::Increasing);
        assert_eq!(with(&[2 * USD, 2 * USD, USD, USD]).trend, Trend::Decreasing);
        assert_eq!(with(&[USD, USD, USD, USD + USD / 20]).trend, Trend::Stable);
        assert_eq!(with(&[USD, 5 * USD, 9 * USD]).trend, Trend::Stable, "too little history for a trend");
    }

    #[test]
    fn a_spike_is_an_anomaly_and_steady_days_are_not() {
        let now = at("2026-11-22T06:00:00Z");
        let mut spends = vec![USD, USD + 10, USD - 10, USD, USD + 5, USD, 10 * USD, USD, USD];
        spends.push(USD / 4);
        let result = forecast(&ForecastInput {
            now,
            daily: daily(now, &spends),
            month_to_date_nanos: 0,
            daily_limit_nanos: None,
            monthly_limit_nanos: None,
        });
        assert_eq!(result.anomalies.len(), 1, "{:?}", result.anomalies);
        let anomaly = &result.anomalies[0];
        assert_eq!((anomaly.date, anomaly.spent_nanos), (date("2026-11-19"), 10 * USD));
        assert!((anomaly.expected_nanos - USD).abs() < 10);
        assert!(anomaly.sigma > 3.0);
    }

    #[test]
    fn days_outside_the_window_are_ignored_and_gaps_are_zero() {
        let now = at("2026-11-22T06:00:00Z");
        let daily = vec![(date("2026-10-01"), 50 * USD), (date("2026-11-20"), 2 * USD), (date("2026-11-22"), USD)];
        let result =
            forecast(&ForecastInput { now, daily, month_to_date_nanos: 3 * USD, daily_limit_nanos: None, monthly_limit_nanos: None });
        assert_eq!(result.series, vec![(date("2026-11-20"), 2 * USD), (date("2026-11-21"), 0), (date("2026-11-22"), USD)]);
        assert_eq!(result.avg_daily_nanos, USD);
    }
}
