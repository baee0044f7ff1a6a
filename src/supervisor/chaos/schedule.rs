//! The seeded schedule of `--chaos` (issue 41): for each fault spec, the gaps between its
//! faults and the draw that picks each fault's rank or node. Pure and reproducible: the same
//! spec and seed give the same schedule on every node and every run (each spec draws from a
//! generator of its own, so adding a spec does not move the others' faults).
//!
//! A gap counts from the spec's clock: the run's first spawn for its first fault, then its
//! previous fault's recovery (`at-attempt=`: that attempt's spawn). The runtime
//! (`chaos/mod.rs`) holds those clocks; this file only says how long each gap is.

use std::time::Duration;

use crate::config::chaos::{ChaosSpec, FaultSpec, Repeat};

/// One planned fault: the spec it comes from, its number within that spec (0-based), the gap
/// before it, and the draw its random rank or node is taken from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Planned {
    pub spec: usize,
    pub nth: u32,
    pub gap: Duration,
    pub draw: u64,
}

/// The schedule of every spec, generated as far as it is read.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub seed: u64,
    specs: Vec<FaultSpec>,
    rngs: Vec<fastrand::Rng>,
    /// Each spec's planned faults drawn so far.
    drawn: Vec<Vec<Planned>>,
}

/// How many of an unbounded spec's faults the start line shows.
pub const SHOWN: u32 = 5;

impl Schedule {
    pub fn new(spec: &ChaosSpec, seed: u64) -> Schedule {
        let rngs = (0..spec.faults.len() as u64)
            .map(|i| fastrand::Rng::with_seed(seed ^ (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        Schedule {
            seed,
            specs: spec.faults.clone(),
            rngs,
            drawn: vec![Vec::new(); spec.faults.len()],
        }
    }

    pub fn specs(&self) -> &[FaultSpec] {
        &self.specs
    }

    /// Spec `spec`'s fault number `nth`, or `None` past its `count`.
    pub fn get(&mut self, spec: usize, nth: u32) -> Option<Planned> {
        let f = self.specs.get(spec)?;
        if f.limit().is_some_and(|l| nth >= l) {
            return None;
        }
        while self.drawn[spec].len() <= nth as usize {
            let k = self.drawn[spec].len() as u32;
            let rng = &mut self.rngs[spec];
            let repeat_gap = |rng: &mut fastrand::Rng| match f.repeat {
                Repeat::Once => Duration::ZERO,
                Repeat::Every(d) => d,
                Repeat::Mtbf(mean) => exponential(rng, mean),
            };
            let gap = match (k, f.after) {
                (0, Some(a)) => a,
                _ => repeat_gap(rng),
            };
            let draw = rng.u64(..);
            self.drawn[spec].push(Planned {
                spec,
                nth: k,
                gap,
                draw,
            });
        }
        Some(self.drawn[spec][nth as usize])
    }

    /// The lines printed at start: each spec, then its first faults' gaps.
    pub fn lines(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..self.specs.len() {
            let shown = self.specs[i].limit().unwrap_or(SHOWN).min(SHOWN);
            let gaps: Vec<String> = (0..shown)
                .filter_map(|n| self.get(i, n))
                .map(|p| format!("+{:.3}s", p.gap.as_secs_f64()))
                .collect();
            let more = match self.specs[i].limit() {
                Some(l) if l <= SHOWN => String::new(),
                _ => ", ...".to_string(),
            };
            out.push(format!(
                "chaos fault {}: {}; gaps {}{more}",
                i + 1,
                self.specs[i].describe(),
                gaps.join(", ")
            ));
        }
        out
    }
}

/// An exponential draw of mean `mean` (inverse transform of a uniform in [0, 1)), capped at
/// 100 means so that one unlucky draw cannot push a fault past any run.
fn exponential(rng: &mut fastrand::Rng, mean: Duration) -> Duration {
    let u = rng.f64();
    let x = (-(1.0 - u).ln()).min(100.0);
    Duration::from_secs_f64(mean.as_secs_f64() * x)
}

/// `n` chosen from `0..of` by `draw` (`of` = 0 gives 0).
pub fn choose(draw: u64, of: usize) -> usize {
    if of == 0 {
        0
    } else {
        (draw % of as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::chaos::parse;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let spec = parse("kill:mtbf=10s,count=50;hang:every=3s,after=1s,rank=random").unwrap();
        let mut a = Schedule::new(&spec, 42);
        let mut b = Schedule::new(&spec, 42);
        let mut c = Schedule::new(&spec, 43);
        let take = |s: &mut Schedule, i| (0..50).filter_map(|n| s.get(i, n)).collect::<Vec<_>>();
        assert_eq!(take(&mut a, 0), take(&mut b, 0));
        assert_eq!(a.lines(), b.lines());
        assert_ne!(take(&mut a, 0), take(&mut c, 0));
        let hang = take(&mut a, 1);
        assert_eq!(hang[0].gap, Duration::from_secs(1));
        assert!(hang[1..].iter().all(|p| p.gap == Duration::from_secs(3)));
        assert_eq!(take(&mut a, 0).len(), 50, "count=50");
    }

    #[test]
    fn adding_a_spec_leaves_the_others_where_they_were() {
        let one = parse("kill:mtbf=10s").unwrap();
        let two = parse("kill:mtbf=10s;hang:mtbf=5s").unwrap();
        let (mut a, mut b) = (Schedule::new(&one, 9), Schedule::new(&two, 9));
        for n in 0..20 {
            assert_eq!(a.get(0, n), b.get(0, n));
        }
    }

    #[test]
    fn once_means_once_and_the_lines_show_the_gaps() {
        let spec = parse("kill:after=20s").unwrap();
        let mut s = Schedule::new(&spec, 1);
        assert!(s.get(0, 0).is_some());
        assert_eq!(s.get(0, 1), None);
        assert_eq!(s.get(1, 0), None, "no such spec");
        assert_eq!(
            s.lines(),
            vec!["chaos fault 1: kill rank=random after=20s; gaps +20.000s"]
        );
        let spec = parse("kill:every=2s").unwrap();
        let line = Schedule::new(&spec, 1).lines().remove(0);
        assert!(
            line.ends_with("gaps +2.000s, +2.000s, +2.000s, +2.000s, +2.000s, ..."),
            "{line}"
        );
    }

    proptest::proptest! {
        /// The mean of many mtbf gaps is near the mean asked for, and no gap is negative or
        /// beyond the cap.
        #[test]
        fn mtbf_gaps_average_the_mean(seed in 0u64..1000) {
            let spec = parse("kill:mtbf=10s").unwrap();
            let mut s = Schedule::new(&spec, seed);
            let gaps: Vec<f64> = (0..2000).map(|n| s.get(0, n).unwrap().gap.as_secs_f64()).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            proptest::prop_assert!((8.0..12.0).contains(&mean), "mean {}", mean);
            proptest::prop_assert!(gaps.iter().all(|g| (0.0..=1000.0).contains(g)));
        }

        #[test]
        fn choose_stays_in_range(draw in proptest::num::u64::ANY, of in 0usize..1000) {
            let c = choose(draw, of);
            proptest::prop_assert!(c < of.max(1));
        }
    }
}
