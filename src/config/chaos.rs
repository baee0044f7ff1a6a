//! The `--chaos` text typed (issue 41): what to inject (`kill`, `hang`, `slow`, `node-loss`),
//! when (`after=`, `every=`, `mtbf=`, `at-attempt=`, `count=`) and where (`rank=`, `node=`),
//! plus `seed=` for the whole schedule and the `slow` knobs (`for=`, `cpu=`). Pure: no clock,
//! no process; every bad input is one line naming the fault and the key.
//!
//! Grammar: `FAULT[;FAULT...]`, `FAULT` = `KIND[:KEY=VALUE[,KEY=VALUE...]]`. Several `--chaos`
//! flags (and `RDRUN_CHAOS`) are joined with `;` before they reach here.

use std::fmt;
use std::time::Duration;

use super::hang::parse_duration;

/// What one fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// SIGKILL of one worker (a crash without a traceback, as an OOM kill looks).
    Kill,
    /// SIGSTOP of one worker: the hang detector must find it.
    Hang,
    /// One rank's CPU throttled for a while (cgroup `cpu.max`).
    Slow,
    /// A whole node's agent and workers killed, as if the machine died.
    NodeLoss,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Hang => "hang",
            Kind::Slow => "slow",
            Kind::NodeLoss => "node-loss",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "kill" => Kind::Kill,
            "hang" => Kind::Hang,
            "slow" => Kind::Slow,
            "node-loss" | "node_loss" => Kind::NodeLoss,
            _ => return None,
        })
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A number, or `random` (a seeded draw at the time of the fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    At(usize),
    Random,
}

impl fmt::Display for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pick::At(n) => write!(f, "{n}"),
            Pick::Random => f.write_str("random"),
        }
    }
}

/// How the faults of one spec follow each other.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Repeat {
    /// Once (`after=` or `at-attempt=` alone).
    Once,
    /// A fixed gap (`every=`).
    Every(Duration),
    /// Gaps drawn from an exponential distribution of this mean (`mtbf=`), seeded.
    Mtbf(Duration),
}

/// One `--chaos` fault, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    pub kind: Kind,
    /// The first gap (`after=`); `None`: the repeat's own first gap (`every`/`mtbf`), or at
    /// once for `at-attempt=`.
    pub after: Option<Duration>,
    pub repeat: Repeat,
    /// Only in this attempt (TORCHELASTIC_RESTART_COUNT), counted from its spawn.
    pub at_attempt: Option<u32>,
    /// How many faults this spec injects at most (`None`: no bound, `every`/`mtbf`).
    pub count: Option<u32>,
    /// A global rank (`kill`, `hang`, `slow`); `None` with `node` set: a random rank of it.
    pub rank: Option<Pick>,
    /// A node (group rank).
    pub node: Option<Pick>,
    /// `slow`: how long the throttle lasts, and the share of one core left to the rank.
    pub slow_for: Duration,
    pub slow_cpu_pct: f64,
}

/// Every `--chaos` fault and the schedule's seed (`None`: chosen at start, and printed).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChaosSpec {
    pub faults: Vec<FaultSpec>,
    pub seed: Option<u64>,
}

/// `slow`'s defaults: 30 s at 10 % of one core.
const SLOW_FOR: Duration = Duration::from_secs(30);
const SLOW_CPU_PCT: f64 = 10.0;

/// Parses the joined `--chaos` text (module doc). Empty text: no fault (chaos off).
pub fn parse(text: &str) -> Result<ChaosSpec, String> {
    let mut spec = ChaosSpec::default();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (fault, seed) = parse_fault(part).map_err(|e| format!("--chaos {part:?}: {e}"))?;
        if let Some(s) = seed {
            match spec.seed {
                Some(old) if old != s => {
                    return Err(format!(
                        "--chaos {part:?}: seed={s} contradicts seed={old} given before (one seed for the whole schedule)"
                    ))
                }
                _ => spec.seed = Some(s),
            }
        }
        spec.faults.push(fault);
    }
    Ok(spec)
}

/// What a spec asks of the run it is given to: `--chaos-progress` needs a fault, a `hang` is only
/// found and stopped under `--hang-detect kill`, `node-loss` needs a multi-node rendezvous.
/// Checked when the config is resolved (a usage error) and again when the run's chaos starts.
pub fn check_plan(
    spec: &ChaosSpec,
    progress: bool,
    hang_kills: bool,
    multi_node: bool,
) -> Result<(), String> {
    if spec.faults.is_empty() && progress {
        return Err("--chaos-progress needs --chaos".to_string());
    }
    for f in &spec.faults {
        if f.kind == Kind::Hang && !hang_kills {
            return Err(format!(
                "--chaos {}: a hang is only found and stopped with --hang-detect kill",
                f.describe()
            ));
        }
        if f.kind == Kind::NodeLoss && !multi_node {
            return Err(format!(
                "--chaos {}: node-loss needs a multi-node rendezvous (c10d or etcd, --nnodes MIN:MAX)",
                f.describe()
            ));
        }
    }
    Ok(())
}

fn parse_fault(part: &str) -> Result<(FaultSpec, Option<u64>), String> {
    let (kind_text, rest) = part.split_once(':').unwrap_or((part, ""));
    let kind = Kind::parse(kind_text.trim()).ok_or_else(|| {
        format!(
            "unknown fault {:?}: expected kill, hang, slow or node-loss",
            kind_text.trim()
        )
    })?;
    let mut f = FaultSpec {
        kind,
        after: None,
        repeat: Repeat::Once,
        at_attempt: None,
        count: None,
        rank: None,
        node: None,
        slow_for: SLOW_FOR,
        slow_cpu_pct: SLOW_CPU_PCT,
    };
    let mut seed = None;
    let mut seen: Vec<&str> = Vec::new();
    for kv in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (key, value) = kv
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .ok_or_else(|| format!("{kv:?} is not KEY=VALUE"))?;
        if seen.contains(&key) {
            return Err(format!("{key}= given twice"));
        }
        seen.push(key);
        let dur = |v: &str| parse_duration(v).map_err(|e| format!("{key}=: {e}"));
        let positive = |v: &str| {
            let d = dur(v)?;
            if d.is_zero() {
                return Err(format!("{key}= must be greater than 0"));
            }
            Ok(d)
        };
        match key {
            "after" => f.after = Some(dur(value)?),
            "every" | "mtbf" if f.repeat != Repeat::Once => {
                return Err("every= and mtbf= exclude each other".to_string())
            }
            "every" => f.repeat = Repeat::Every(positive(value)?),
            "mtbf" => f.repeat = Repeat::Mtbf(positive(value)?),
            "at-attempt" | "at_attempt" => f.at_attempt = Some(number(key, value)?),
            "count" => match number(key, value)? {
                0 => return Err("count= must be at least 1".to_string()),
                n => f.count = Some(n),
            },
            "rank" => f.rank = Some(pick(key, value)?),
            "node" => f.node = Some(pick(key, value)?),
            "seed" => seed = Some(number::<u64>(key, value)?),
            "for" => f.slow_for = positive(value)?,
            "cpu" => f.slow_cpu_pct = percent(value)?,
            other => {
                return Err(format!(
                    "unknown key {other:?}: expected after, every, mtbf, at-attempt, count, rank, node, seed, for or cpu"
                ))
            }
        }
    }
    check(&f, &seen)?;
    // Where, when not said: a random rank (node-loss: a random node).
    match f.kind {
        Kind::NodeLoss => {
            f.node.get_or_insert(Pick::Random);
        }
        _ if f.node.is_none() => {
            f.rank.get_or_insert(Pick::Random);
        }
        _ => {}
    }
    Ok((f, seed))
}

/// The combinations that make no sense, refused with the reason.
fn check(f: &FaultSpec, seen: &[&str]) -> Result<(), String> {
    if f.after.is_none() && f.repeat == Repeat::Once && f.at_attempt.is_none() {
        return Err("say when: after=, every=, mtbf= or at-attempt=".to_string());
    }
    if f.at_attempt.is_some() && f.repeat != Repeat::Once {
        return Err("at-attempt= injects once in that attempt: no every= or mtbf=".to_string());
    }
    if f.kind != Kind::Slow && (seen.contains(&"for") || seen.contains(&"cpu")) {
        return Err(format!("for= and cpu= belong to slow, not {}", f.kind));
    }
    if f.kind == Kind::NodeLoss && f.rank.is_some() {
        return Err("node-loss takes node=, not rank= (the whole node goes)".to_string());
    }
    if let (Some(Pick::At(_)), Some(_)) = (f.rank, f.node) {
        return Err("rank=N names a global rank: give node= only with rank=random".to_string());
    }
    Ok(())
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{key}={value:?} is not a non-negative integer"))
}

fn pick(key: &str, value: &str) -> Result<Pick, String> {
    match value {
        "random" => Ok(Pick::Random),
        v => number(key, v)
            .map(Pick::At)
            .map_err(|_| format!("{key}={value:?}: expected a number or random")),
    }
}

fn percent(value: &str) -> Result<f64, String> {
    let v: f64 = value
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("cpu={value:?}: expected a percentage of one core, e.g. 10%"))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!("cpu={value:?}: must be above 0 and at most 100"));
    }
    Ok(v)
}

impl FaultSpec {
    /// `kill rank=random every=30s` as the schedule line shows it.
    pub fn describe(&self) -> String {
        let mut s = self.kind.as_str().to_string();
        if let Some(n) = self.node {
            s.push_str(&format!(" node={n}"));
        }
        if let Some(r) = self.rank {
            s.push_str(&format!(" rank={r}"));
        }
        if let Some(a) = self.at_attempt {
            s.push_str(&format!(" at-attempt={a}"));
        }
        if let Some(a) = self.after {
            s.push_str(&format!(" after={}", secs(a)));
        }
        match self.repeat {
            Repeat::Once => {}
            Repeat::Every(d) => s.push_str(&format!(" every={}", secs(d))),
            Repeat::Mtbf(d) => s.push_str(&format!(" mtbf={}", secs(d))),
        }
        if let Some(c) = self.count {
            s.push_str(&format!(" count={c}"));
        }
        if self.kind == Kind::Slow {
            s.push_str(&format!(
                " for={} cpu={}%",
                secs(self.slow_for),
                self.slow_cpu_pct
            ));
        }
        s
    }

    /// How many faults this spec injects at most (`None`: unbounded).
    pub fn limit(&self) -> Option<u32> {
        match (self.count, self.repeat) {
            (Some(c), _) => Some(c),
            (None, Repeat::Once) => Some(1),
            (None, _) => None,
        }
    }
}

/// `20s`, `1.5s`.
pub fn secs(d: Duration) -> String {
    format!("{}s", (d.as_secs_f64() * 1000.0).round() / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_of_the_issue_parse() {
        let s = parse("kill:after=20s").unwrap();
        assert_eq!(s.faults.len(), 1);
        let f = &s.faults[0];
        assert_eq!(
            (f.kind, f.after, f.repeat, f.limit()),
            (
                Kind::Kill,
                Some(Duration::from_secs(20)),
                Repeat::Once,
                Some(1)
            )
        );
        let s =
            parse("kill:every=30s ; hang:mtbf=2m,seed=7,rank=1;slow:at-attempt=1,for=5s,cpu=20%")
                .unwrap();
        assert_eq!(s.seed, Some(7));
        assert_eq!(s.faults[0].repeat, Repeat::Every(Duration::from_secs(30)));
        assert_eq!(s.faults[0].limit(), None);
        assert_eq!(s.faults[1].repeat, Repeat::Mtbf(Duration::from_secs(120)));
        assert_eq!(s.faults[1].rank, Some(Pick::At(1)));
        assert_eq!(s.faults[2].at_attempt, Some(1));
        assert_eq!(s.faults[2].slow_for, Duration::from_secs(5));
        assert_eq!(s.faults[2].slow_cpu_pct, 20.0);
        let s = parse("node-loss:after=10s,node=1").unwrap();
        assert_eq!(s.faults[0].node, Some(Pick::At(1)));
        assert_eq!(parse("").unwrap(), ChaosSpec::default());
        assert_eq!(
            parse("kill:every=1s,count=20").unwrap().faults[0].limit(),
            Some(20)
        );
    }

    #[test]
    fn bad_input_is_one_line_naming_what_was_wrong() {
        for (text, needle) in [
            ("explode:after=1s", "unknown fault \"explode\""),
            ("kill", "say when"),
            ("kill:after", "is not KEY=VALUE"),
            ("kill:after=soon", "after="),
            ("kill:every=0s", "every= must be greater than 0"),
            ("kill:every=1s,mtbf=2s", "exclude each other"),
            ("kill:after=1s,after=2s", "given twice"),
            ("kill:after=1s,rank=-1", "rank=\"-1\""),
            ("kill:after=1s,colour=red", "unknown key \"colour\""),
            ("kill:after=1s,for=3s", "belong to slow"),
            ("slow:after=1s,cpu=0", "above 0"),
            ("node-loss:after=1s,rank=2", "takes node="),
            ("kill:after=1s,rank=2,node=1", "rank=random"),
            ("kill:at-attempt=1,every=3s", "at-attempt="),
            ("kill:after=1s,count=0", "at least 1"),
            ("kill:after=1s,seed=1;hang:after=2s,seed=2", "contradicts"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
            assert!(!e.contains('\n'), "{e}");
            assert!(e.starts_with("--chaos "), "{e}");
        }
    }

    #[test]
    fn describe_reads_back_as_the_same_spec() {
        for text in [
            "kill:after=20s",
            "hang:rank=1,every=30s,count=3",
            "kill:mtbf=45s,after=5s,node=1",
            "slow:after=2s,for=5s,cpu=25",
            "node-loss:at-attempt=2,node=random",
        ] {
            let f = parse(text).unwrap().faults.remove(0);
            let shown = f.describe();
            let (kind, rest) = shown.split_once(' ').unwrap();
            let again = parse(&format!("{kind}:{}", rest.replace(' ', ","))).unwrap();
            assert_eq!(again.faults[0], f, "{text} -> {shown}");
        }
    }

    proptest::proptest! {
        /// Any text gives a spec or a one-line error, never a panic.
        #[test]
        fn never_panics(text in "[a-z=:;,0-9%. -]{0,60}") {
            if let Err(e) = parse(&text) {
                proptest::prop_assert!(!e.contains('\n'));
            }
        }
    }
}
