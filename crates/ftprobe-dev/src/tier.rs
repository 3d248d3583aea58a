//! Test tiers for the `harness = false` test binaries, read from their arguments the way
//! libtest reads them, so that one command line drives every test binary alike:
//!
//! - no flag: the quick tier, what `cargo test --workspace` (the README's test command) runs;
//! - `--ignored`: the stress tier only (long stress and soak cases: libtest's `#[ignore]`d
//!   tests, these binaries' cases marked [`Tier::Stress`]); `.ci/run` runs it as
//!   `cargo test --workspace -- --ignored`;
//! - `--include-ignored`: both.
//!
//! Other arguments that do not start with `-` filter the cases by name (a substring), as
//! libtest's filter does.

/// Which tier a case belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Run by the README's test command.
    Quick,
    /// Run only with `--ignored` or `--include-ignored` (`.ci/run`'s second tier).
    Stress,
}

/// What this test binary's command line asks for.
#[derive(Clone, Debug)]
pub struct Selection {
    quick: bool,
    stress: bool,
    filters: Vec<String>,
}

impl Selection {
    /// Read from `std::env::args()`.
    pub fn from_args() -> Selection {
        Selection::parse(std::env::args().skip(1))
    }

    /// Read from the arguments after the program's name.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Selection {
        let (mut ignored, mut include) = (false, false);
        let mut filters = Vec::new();
        for a in args {
            match a.as_str() {
                "--ignored" => ignored = true,
                "--include-ignored" => include = true,
                _ if a.starts_with('-') => {}
                _ => filters.push(a),
            }
        }
        Selection {
            quick: include || !ignored,
            stress: include || ignored,
            filters,
        }
    }

    /// Whether any case of `tier` runs (a binary with no stress case returns at once when
    /// this is false for [`Tier::Quick`]).
    pub fn runs_tier(&self, tier: Tier) -> bool {
        match tier {
            Tier::Quick => self.quick,
            Tier::Stress => self.stress,
        }
    }

    /// Whether the case `name` of `tier` runs.
    pub fn runs(&self, name: &str, tier: Tier) -> bool {
        self.runs_tier(tier)
            && (self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str())))
    }
}

/// For a binary with no stress case: whether its (quick) cases run at all.
pub fn quick_tier_requested() -> bool {
    Selection::from_args().runs_tier(Tier::Quick)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(args: &[&str]) -> Selection {
        Selection::parse(args.iter().map(|a| a.to_string()))
    }

    #[test]
    fn flags_pick_the_tiers_as_libtest_does() {
        let quick = sel(&[]);
        assert!(quick.runs("a", Tier::Quick) && !quick.runs("a", Tier::Stress));
        let stress = sel(&["--ignored"]);
        assert!(!stress.runs("a", Tier::Quick) && stress.runs("a", Tier::Stress));
        let both = sel(&["--include-ignored", "--nocapture"]);
        assert!(both.runs("a", Tier::Quick) && both.runs("a", Tier::Stress));
    }

    #[test]
    fn words_filter_by_substring() {
        let s = sel(&["switch", "--ignored"]);
        assert!(s.runs("ten_thousand_switches", Tier::Stress));
        assert!(!s.runs("calls_in_the_range", Tier::Stress));
    }
}
