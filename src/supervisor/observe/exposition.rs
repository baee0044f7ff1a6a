//! Which text format a `/metrics` request gets, and the classic Prometheus text format (0.0.4).
//!
//! `prometheus-client` (the registry in [`super::metrics`]) encodes OpenMetrics text only; it has
//! no encoder for the classic format, and the crate that has one (`prometheus`) keeps a registry
//! of its own. A client that asks for the classic format (Python's `prometheus_client` text
//! parser, `promtool check metrics`, some agents) reads OpenMetrics counters as untyped with no
//! help, because OpenMetrics names a counter's family without its `_total` sample suffix. So the
//! classic text is derived from the OpenMetrics text by the rules that separate the two formats
//! (the families, samples and values stay prometheus-client's):
//!
//! - a counter family `x` becomes `x_total` in `# HELP` and `# TYPE`; its `_created` samples go;
//! - `info` and `stateset` become `gauge` (`info` named `x_info`, as its sample), other types that
//!   0.0.4 lacks become `untyped`;
//! - `# UNIT` and `# EOF` lines and exemplars go.

/// `Content-Type` of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of the classic text format.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request with this `Accept` header gets OpenMetrics: when it lists
/// `application/openmetrics-text` (no version, or 1.0.0 / 0.0.1) with a quality above 0 and at
/// least that of `text/plain` (or a wildcard). No header, or one without OpenMetrics: classic,
/// the format every Prometheus client reads (as the Go and Python clients decide).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    let (mut open, mut classic) = (None::<f64>, None::<f64>);
    for item in accept.split(',') {
        let mut params = item.split(';');
        let media = params.next().unwrap_or("").trim().to_ascii_lowercase();
        let (mut q, mut version) = (1.0, None);
        for p in params {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = v.trim().parse().unwrap_or(0.0),
                "version" => version = Some(v.trim().trim_matches('"').to_string()),
                _ => {}
            }
        }
        let best = |b: &mut Option<f64>| *b = Some(b.map_or(q, |x: f64| x.max(q)));
        match media.as_str() {
            "application/openmetrics-text"
                if matches!(version.as_deref(), None | Some("1.0.0" | "0.0.1")) =>
            {
                best(&mut open)
            }
            "text/plain" | "text/*" | "*/*" => best(&mut classic),
            _ => {}
        }
    }
    open.is_some_and(|q| q > 0.0 && q >= classic.unwrap_or(0.0))
}

/// The classic text format of an OpenMetrics exposition (see the module docs).
pub fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    let mut counter = false;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            counter = kind == "counter";
            let (name, kind) = match kind {
                "counter" => (format!("{family}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (family.to_string(), kind),
                "info" => (format!("{family}_info"), "gauge"),
                "stateset" => (family.to_string(), "gauge"),
                _ => (family.to_string(), "untyped"),
            };
            if let Some((_, text)) = help.take().filter(|(n, _)| *n == family) {
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let sample = without_exemplar(line);
        let name = sample.split(['{', ' ']).next().unwrap_or("");
        if counter && name.ends_with("_created") {
            continue;
        }
        out.push_str(sample.trim_end());
        out.push('\n');
    }
    out
}

/// A sample line without its exemplar (` # {...} value`), which may follow the value; label
/// values (quoted, with `\` escapes) may themselves contain ` # `.
fn without_exemplar(line: &str) -> &str {
    let mut labels_end = 0;
    if let Some(open) = line
        .find('{')
        .filter(|o| line.find(' ').map_or(true, |s| *o < s))
    {
        let (mut quoted, mut escaped) = (false, false);
        for (i, c) in line[open..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    labels_end = open + i;
                    break;
                }
                _ => {}
            }
        }
    }
    match line[labels_end..].find(" # ") {
        Some(at) => &line[..labels_end + at],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_chooses_the_format() {
        // Prometheus 2.x's scrape header: OpenMetrics first.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                    version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prom)));
        assert!(wants_openmetrics(Some("application/openmetrics-text")));
        for classic in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4"),
            Some("application/openmetrics-text;q=0"),
            Some("application/openmetrics-text;q=0.2, text/plain"),
            Some("application/openmetrics-text; version=2.0.0"),
            Some("application/json"),
        ] {
            assert!(!wants_openmetrics(classic), "{classic:?}");
        }
    }

    #[test]
    fn classic_text_names_counters_with_total() {
        let open = "# HELP rdrun_restarts Restarts\n# TYPE rdrun_restarts counter\n\
                    rdrun_restarts_total{charged=\"true\"} 1\n\
                    rdrun_restarts_created{charged=\"true\"} 1.5e9\n\
                    # HELP rdrun_attempt The attempt\n# TYPE rdrun_attempt gauge\n\
                    # UNIT rdrun_attempt attempts\nrdrun_attempt 2\n\
                    # HELP b Build\n# TYPE b info\nb_info{v=\"1 # 2\"} 1 # {trace=\"x\"} 1\n# EOF\n";
        assert_eq!(
            classic(open),
            "# HELP rdrun_restarts_total Restarts\n# TYPE rdrun_restarts_total counter\n\
             rdrun_restarts_total{charged=\"true\"} 1\n\
             # HELP rdrun_attempt The attempt\n# TYPE rdrun_attempt gauge\nrdrun_attempt 2\n\
             # HELP b_info Build\n# TYPE b_info gauge\nb_info{v=\"1 # 2\"} 1\n"
        );
    }
}
