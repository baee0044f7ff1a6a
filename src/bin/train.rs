//! The `train` demo: a candle MLP trained data-parallel through rdrun's runtime.

fn main() {
    std::process::exit(1);
}
