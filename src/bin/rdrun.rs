//! The `rdrun` binary: parse -> resolve -> tracing -> supervisor -> exit code.

fn main() {
    std::process::exit(rdrun::exit::LAUNCHER_FAILURE);
}
