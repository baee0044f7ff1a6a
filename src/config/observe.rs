//! What the launcher tells the outside while it runs (issue 15, "Watching a run"): where the
//! lifecycle events go (`--events`, `--event-log-handler console`, `<log-dir>/<run>/events.jsonl`),
//! where `/metrics` is served (`--metrics-addr`, RDRUN_METRICS_ADDR) and the health port
//! (TORCHELASTIC_HEALTH_CHECK_PORT). Resolved here so that bad values fail before anything
//! starts, with one line naming the flag or variable.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// Where `--events` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventsDest {
    /// `--events -`.
    Stderr,
    File(PathBuf),
}

/// The resolved observability settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObserveSettings {
    /// `--events PATH|-`: one JSON object per line, besides the log directory's copy.
    pub events: Option<EventsDest>,
    /// `--event-log-handler console`: the same events as text lines on stderr.
    pub console: bool,
    /// `--metrics-addr HOST:PORT` (RDRUN_METRICS_ADDR): Prometheus text at `/metrics`.
    pub metrics_addr: Option<SocketAddr>,
    /// TORCHELASTIC_HEALTH_CHECK_PORT: HTTP on every address of this port.
    pub health_port: Option<u16>,
}

/// Resolves the settings from the flags and the environment; `Err((what, value, why))`.
pub fn resolve(
    events: Option<&str>,
    event_log_handler: &str,
    metrics_addr: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ObserveSettings, (&'static str, String, String)> {
    let events = match events {
        None => None,
        Some("") => {
            return Err((
                "--events",
                String::new(),
                "must be a file path or - (stderr)".into(),
            ))
        }
        Some("-") => Some(EventsDest::Stderr),
        Some(p) => Some(EventsDest::File(PathBuf::from(p))),
    };
    let metrics_addr = match metrics_addr
        .map(|v| ("--metrics-addr", v.to_string()))
        .or_else(|| env("RDRUN_METRICS_ADDR").map(|v| ("RDRUN_METRICS_ADDR", v)))
    {
        None => None,
        Some((what, v)) if v.trim().is_empty() => {
            if what == "--metrics-addr" {
                return Err((what, v, "must be HOST:PORT or PORT".into()));
            }
            None
        }
        Some((what, v)) => Some(parse_addr(&v).map_err(|why| (what, v, why))?),
    };
    let health_port = match env("TORCHELASTIC_HEALTH_CHECK_PORT") {
        None => None,
        Some(v) if v.trim().is_empty() => None,
        Some(v) => Some(v.trim().parse::<u16>().map_err(|_| {
            (
                "TORCHELASTIC_HEALTH_CHECK_PORT",
                v.clone(),
                "must be a port number between 0 and 65535".to_string(),
            )
        })?),
    };
    Ok(ObserveSettings {
        events,
        console: event_log_handler == "console",
        metrics_addr,
        health_port,
    })
}

/// `HOST:PORT`, `[V6]:PORT`, `:PORT` or `PORT` (loopback). A host name resolves now, to its
/// first address.
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let loopback = |p: &str| {
        p.parse::<u16>()
            .map(|port| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
            .map_err(|_| format!("the port {p:?} is not a number between 0 and 65535"))
    };
    if let Some(port) = text.strip_prefix(':') {
        return loopback(port);
    }
    if !text.contains(':') {
        return loopback(text);
    }
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("must be HOST:PORT".into());
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("the port {port:?} is not a number between 0 and 65535"))?;
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host:?} has no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn flags_and_variables() {
        let s = resolve(Some("-"), "console", None, &env(&[])).unwrap();
        assert_eq!(s.events, Some(EventsDest::Stderr));
        assert!(s.console);
        assert_eq!(s.metrics_addr, None);
        let s = resolve(
            Some("/x/e.jsonl"),
            "null",
            None,
            &env(&[
                ("RDRUN_METRICS_ADDR", "127.0.0.1:9100"),
                ("TORCHELASTIC_HEALTH_CHECK_PORT", "8080"),
            ]),
        )
        .unwrap();
        assert_eq!(s.events, Some(EventsDest::File("/x/e.jsonl".into())));
        assert_eq!(s.metrics_addr, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(s.health_port, Some(8080));
        // The flag wins over the variable.
        let s = resolve(
            None,
            "null",
            Some("[::1]:9200"),
            &env(&[("RDRUN_METRICS_ADDR", "127.0.0.1:9100")]),
        )
        .unwrap();
        assert_eq!(s.metrics_addr, Some("[::1]:9200".parse().unwrap()));
    }

    #[test]
    fn addresses() {
        assert_eq!(
            parse_addr("9100").unwrap(),
            "127.0.0.1:9100".parse().unwrap()
        );
        assert_eq!(parse_addr(":0").unwrap(), "127.0.0.1:0".parse().unwrap());
        assert!(parse_addr("localhost:9100").unwrap().ip().is_loopback());
        assert!(parse_addr("h:99999").unwrap_err().contains("99999"));
        assert!(parse_addr("x").unwrap_err().contains("\"x\""));
    }

    #[test]
    fn bad_values_name_what_was_wrong() {
        let e = resolve(None, "null", Some("1.2.3.4:abc"), &env(&[])).unwrap_err();
        assert_eq!(e.0, "--metrics-addr");
        let e = resolve(
            None,
            "null",
            None,
            &env(&[("TORCHELASTIC_HEALTH_CHECK_PORT", "http")]),
        )
        .unwrap_err();
        assert_eq!(e.0, "TORCHELASTIC_HEALTH_CHECK_PORT");
        assert!(resolve(Some(""), "null", None, &env(&[])).is_err());
    }
}
