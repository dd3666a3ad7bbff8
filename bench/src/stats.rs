//! Percentiles within a measurement, and medians with their spread across
//! the repetitions of one contender in one scenario.

use crate::contenders::Contender;
use crate::scenarios::{Measurement, Scenario};

/// Median of the repetitions, with the lowest and highest next to it.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` when there are no values.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut values: Vec<f64> = values.into_iter().collect();
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let mid = values.len() / 2;
        let median = if values.len() % 2 == 1 {
            values[mid]
        } else {
            (values[mid - 1] + values[mid]) / 2.0
        };
        Some(Spread {
            median,
            min: values[0],
            max: values[values.len() - 1],
        })
    }
}

/// All repetitions of one contender in one scenario, folded together.
#[derive(Clone, Debug)]
pub struct Summary {
    pub scenario: Scenario,
    pub contender: Contender,
    pub pairs_per_sec: Spread,
    pub p50_us: Spread,
    pub p99_us: Spread,
    pub cpu_us_per_pair: Spread,
    pub server_busy: Spread,
    pub acquired_share: Spread,
    pub bytes_per_holder: Option<Spread>,
}

/// One summary per (scenario, contender), in the order of `scenarios` and
/// then `contenders`.
pub fn summarize(
    measurements: &[Measurement],
    scenarios: &[Scenario],
    contenders: &[Contender],
) -> Vec<Summary> {
    let mut summaries = Vec::new();
    for &scenario in scenarios {
        for &contender in contenders {
            let reps: Vec<&Measurement> = measurements
                .iter()
                .filter(|m| m.scenario == scenario && m.contender == contender)
                .collect();
            if reps.is_empty() {
                continue;
            }
            let spread = |f: fn(&Measurement) -> f64| {
                Spread::of(reps.iter().map(|m| f(m))).expect("at least one repetition")
            };
            summaries.push(Summary {
                scenario,
                contender,
                pairs_per_sec: spread(Measurement::pairs_per_sec),
                p50_us: spread(|m| m.p50_us),
                p99_us: spread(|m| m.p99_us),
                cpu_us_per_pair: spread(Measurement::cpu_us_per_pair),
                server_busy: spread(Measurement::server_busy),
                acquired_share: spread(Measurement::acquired_share),
                bytes_per_holder: Spread::of(reps.iter().filter_map(|m| m.bytes_per_holder)),
            });
        }
    }
    summaries
}

/// The summary of `contender` in `scenario`, if both were run.
pub fn find(summaries: &[Summary], scenario: Scenario, contender: Contender) -> Option<&Summary> {
    summaries
        .iter()
        .find(|s| s.scenario == scenario && s.contender == contender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_middle_and_extremes() {
        let s = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of([4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Spread::of([]).is_none());
    }
}
