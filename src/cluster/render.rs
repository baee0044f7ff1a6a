//! The resolved [`Topology`] for people (text, each field with its source) and for tools
//! (JSON with the same fields and sources), for a later `--dry-run` / `--print-topology[=json]`.

use super::{Fields, Sourced, Topology};
use serde_json::{json, Map, Value};

/// A value as a user writes it on a command line (`3`, `2:4`, `node`, `h0`, `[a, b]`), for
/// notes and errors: never Rust's `Debug` text (`NodeCount { min: 3, max: 3 }`).
pub trait UserText {
    fn user_text(&self) -> String;
}

macro_rules! user_text_by_display {
    ($($t:ty),*) => {$(
        impl UserText for $t {
            fn user_text(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

user_text_by_display!(usize, u16, bool, String, super::NodeCount);

impl UserText for super::Mode {
    fn user_text(&self) -> String {
        self.name().to_string()
    }
}

impl UserText for Vec<String> {
    fn user_text(&self) -> String {
        short_list(self)
    }
}

/// Every set field as `(name, value as text, source)`, in a fixed order.
pub fn rows(f: &Fields) -> Vec<(&'static str, String, String)> {
    fn row<T>(
        out: &mut Vec<(&'static str, String, String)>,
        name: &'static str,
        v: &Option<Sourced<T>>,
        show: impl Fn(&T) -> String,
    ) {
        if let Some(s) = v {
            out.push((name, show(&s.value), s.source.clone()));
        }
    }
    let mut out = Vec::new();
    row(&mut out, "mode", &f.mode, |m| m.name().to_string());
    row(&mut out, "nnodes", &f.nnodes, |n| n.to_string());
    row(&mut out, "node_rank", &f.node_rank, usize::to_string);
    row(&mut out, "master_addr", &f.master_addr, String::clone);
    row(&mut out, "master_port", &f.master_port, u16::to_string);
    row(&mut out, "backend", &f.backend, String::clone);
    row(&mut out, "run_id", &f.run_id, String::clone);
    row(&mut out, "nproc_per_node", &f.nproc, String::clone);
    row(&mut out, "rank", &f.rank, usize::to_string);
    row(&mut out, "local_rank", &f.local_rank, usize::to_string);
    row(&mut out, "world_size", &f.world_size, usize::to_string);
    row(
        &mut out,
        "local_world_size",
        &f.local_world_size,
        usize::to_string,
    );
    row(&mut out, "standalone", &f.standalone, bool::to_string);
    row(&mut out, "node_list", &f.node_list, |l| short_list(l));
    row(&mut out, "devices", &f.devices, |l| l.join(","));
    out
}

/// `[a, b, …, z] (N)` for long lists, all of them for short ones.
fn short_list(l: &[String]) -> String {
    if l.len() <= 4 {
        format!("[{}]", l.join(", "))
    } else {
        format!(
            "[{}, {}, …, {}] ({} hosts)",
            l[0],
            l[1],
            l[l.len() - 1],
            l.len()
        )
    }
}

/// The full block, one `rdrun:` line per field with its source, then the notes.
pub fn text(t: &Topology) -> String {
    let mut s = format!("rdrun: topology  source={}\n", t.scheduler);
    for (name, value, source) in rows(&t.fields) {
        s.push_str(&format!("rdrun:   {name:<16} {value}  ({source})\n"));
    }
    for n in &t.notes {
        s.push_str(&format!("rdrun:   note: {n}\n"));
    }
    s
}

/// The one line other nodes print.
pub fn one_line(t: &Topology) -> String {
    let f = &t.fields;
    let v = |o: Option<String>| o.unwrap_or_else(|| "?".into());
    if f.mode.as_ref().map(|m| m.value) == Some(super::Mode::InPlace) {
        return format!(
            "rdrun: rank {}/{} (local {}/{}) -> endpoint {} ({}), mode in-place",
            v(f.rank.as_ref().map(|x| x.value.to_string())),
            v(f.world_size.as_ref().map(|x| x.value.to_string())),
            v(f.local_rank.as_ref().map(|x| x.value.to_string())),
            v(f.local_world_size.as_ref().map(|x| x.value.to_string())),
            super::host_port(
                &v(f.master_addr.as_ref().map(|x| x.value.clone())),
                &v(f.master_port.as_ref().map(|x| x.value.to_string())),
            ),
            t.scheduler,
        );
    }
    format!(
        "rdrun: node {}/{} -> endpoint {} ({}), mode {}",
        v(f.node_rank.as_ref().map(|x| x.value.to_string())),
        v(f.nnodes.as_ref().map(|x| x.value.to_string())),
        super::host_port(
            &v(f.master_addr.as_ref().map(|x| x.value.clone())),
            &v(f.master_port.as_ref().map(|x| x.value.to_string())),
        ),
        t.scheduler,
        v(f.mode.as_ref().map(|x| x.value.name().to_string())),
    )
}

/// `{"source": …, "fields": {name: {"value": …, "source": …}}, "notes": […]}`; numbers stay
/// numbers, the node list and devices arrays.
pub fn json(t: &Topology) -> Value {
    let f = &t.fields;
    let mut m = Map::new();
    let mut put = |name: &str, value: Value, source: &str| {
        m.insert(name.to_string(), json!({"value": value, "source": source}));
    };
    for (name, value, source) in rows(f) {
        let v = match name {
            "node_rank" | "master_port" | "rank" | "local_rank" | "world_size"
            | "local_world_size" => value
                .parse::<u64>()
                .map(Value::from)
                .unwrap_or(Value::from(value)),
            "standalone" => Value::Bool(value == "true"),
            "nnodes" => {
                let n = f.nnodes.as_ref().expect("row exists").value;
                json!({"min": n.min, "max": n.max})
            }
            "node_list" => json!(f.node_list.as_ref().expect("row exists").value),
            "devices" => json!(f.devices.as_ref().expect("row exists").value),
            _ => Value::from(value),
        };
        put(name, v, &source);
    }
    json!({"source": t.scheduler, "fields": Value::Object(m), "notes": t.notes})
}
