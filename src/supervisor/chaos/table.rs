//! The end of a chaos run (issue 41 item 2): the table printed at the end (count, median, p95
//! and max of detect, recover, first progress and work lost per fault kind), the same in
//! `--report-json`'s `chaos` section, and the lines naming each fault that was not survived.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::measure::{stats, Record, State};
use crate::config::chaos::Kind;

/// One fault kind's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub kind: Kind,
    pub injected: usize,
    pub survived: usize,
    pub detect: Option<(f64, f64, f64)>,
    pub recover: Option<(f64, f64, f64)>,
    pub progress: Option<(f64, f64, f64)>,
    pub work_lost: Option<(f64, f64, f64)>,
}

/// The rows, one per kind that was injected (skipped faults are no injection).
pub fn rows(records: &[Record]) -> Vec<Row> {
    let mut by: BTreeMap<Kind, Vec<&Record>> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| !matches!(r.state, State::Skipped(_)))
    {
        by.entry(r.kind).or_default().push(r);
    }
    by.into_iter()
        .map(|(kind, rs)| {
            let col = |f: &dyn Fn(&Record) -> Option<f64>| {
                stats(&rs.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
            };
            Row {
                kind,
                injected: rs.len(),
                survived: rs.iter().filter(|r| r.state == State::Recovered).count(),
                detect: col(&|r| r.detected.map(|d| d.as_secs_f64())),
                recover: col(&|r| r.recovered.map(|d| d.as_secs_f64())),
                progress: col(&|r| r.progress.map(|d| d.as_secs_f64())),
                work_lost: col(&|r| r.work_lost()),
            }
        })
        .collect()
}

/// The table, one line each (header first); empty without any fault injected.
pub fn render(records: &[Record]) -> Vec<String> {
    let rows = rows(records);
    if rows.is_empty() {
        return Vec::new();
    }
    let cell = |s: Option<(f64, f64, f64)>, unit: &str| match s {
        Some((m, p, x)) => format!("{m:.2}/{p:.2}/{x:.2}{unit}"),
        None => "-".to_string(),
    };
    let mut out = vec![format!(
        "{:<10} {:>8} {:>8}  {:<22} {:<22} {:<22} {:<18}",
        "chaos",
        "injected",
        "survived",
        "detect med/p95/max",
        "recover med/p95/max",
        "progress med/p95/max",
        "work lost med/p95/max"
    )];
    for r in &rows {
        out.push(format!(
            "{:<10} {:>8} {:>8}  {:<22} {:<22} {:<22} {:<18}",
            r.kind.as_str(),
            r.injected,
            r.survived,
            cell(r.detect, " s"),
            cell(r.recover, " s"),
            cell(r.progress, " s"),
            cell(r.work_lost, ""),
        ));
    }
    out.iter().map(|l| l.trim_end().to_string()).collect()
}

/// One line per fault that the job did not survive: `chaos: fault 2 (kill rank 1 in attempt
/// 1) was not survived: the job ended without coming back to user code`.
pub fn not_survived(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match &r.state {
            State::NotSurvived(why) => Some(format!(
                "chaos: fault {} ({} in attempt {}) was not survived: {why}",
                r.id,
                r.what(),
                r.attempt
            )),
            _ => None,
        })
        .collect()
}

/// `--report-json`'s `chaos` section: the seed, every fault, and the table's rows by kind.
pub fn to_json(seed: u64, specs: &[String], records: &[Record]) -> Value {
    let trio =
        |s: Option<(f64, f64, f64)>| s.map(|(m, p, x)| json!({"median": m, "p95": p, "max": x}));
    let summary: serde_json::Map<String, Value> = rows(records)
        .into_iter()
        .map(|r| {
            (
                r.kind.as_str().to_string(),
                json!({
                    "injected": r.injected,
                    "survived": r.survived,
                    "detect_s": trio(r.detect),
                    "recover_s": trio(r.recover),
                    "progress_s": trio(r.progress),
                    "work_lost": trio(r.work_lost),
                }),
            )
        })
        .collect();
    json!({
        "seed": seed,
        "specs": specs,
        "faults": records.iter().map(Record::to_json).collect::<Vec<_>>(),
        "summary": summary,
        "survived": records.iter().all(|r| !matches!(r.state, State::NotSurvived(_))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn rec(id: usize, kind: Kind, recover_ms: Option<u64>, state: State) -> Record {
        Record {
            id,
            spec: 0,
            number: id as u32 - 1,
            kind,
            rank: Some(1),
            node: 0,
            attempt: id as u32 - 1,
            pid: Some(100),
            at: SystemTime::UNIX_EPOCH,
            detected: Some(Duration::from_millis(10)),
            recovered: recover_ms.map(Duration::from_millis),
            progress: None,
            before: Some(10.0),
            after: Some(5.0),
            state,
        }
    }

    #[test]
    fn one_row_per_kind_with_its_statistics() {
        let records = vec![
            rec(1, Kind::Kill, Some(1000), State::Recovered),
            rec(2, Kind::Kill, Some(3000), State::Recovered),
            rec(
                3,
                Kind::Hang,
                None,
                State::NotSurvived("no restart left".into()),
            ),
            rec(4, Kind::Slow, None, State::Skipped("no cgroup".into())),
        ];
        let rows = rows(&records);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            (rows[0].kind, rows[0].injected, rows[0].survived),
            (Kind::Kill, 2, 2)
        );
        assert_eq!(rows[0].recover, Some((1.0, 3.0, 3.0)));
        assert_eq!(rows[0].work_lost, Some((5.0, 5.0, 5.0)));
        assert_eq!((rows[1].kind, rows[1].survived), (Kind::Hang, 0));
        let table = render(&records);
        assert_eq!(table.len(), 3);
        assert!(table[1].starts_with("kill"), "{}", table[1]);
        assert!(table[1].contains("1.00/3.00/3.00 s"), "{}", table[1]);
        let lines = not_survived(&records);
        assert_eq!(
            lines,
            vec!["chaos: fault 3 (hang rank 1 in attempt 2) was not survived: no restart left"]
        );
        let j = to_json(7, &["kill:after=1s".into()], &records);
        assert_eq!(j["seed"], 7);
        assert_eq!(j["survived"], false);
        assert_eq!(j["summary"]["kill"]["recover_s"]["p95"], 3.0);
        assert_eq!(j["faults"].as_array().unwrap().len(), 4);
        assert!(render(&[]).is_empty());
    }
}
