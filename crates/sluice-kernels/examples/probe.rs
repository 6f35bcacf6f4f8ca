//! Prints [`sluice_kernels::probe::measure`] as JSON: `cargo run --release -p sluice-kernels
//! --example probe -- [THREADS] [BUDGET_SECS]` (defaults: every core, 10 s).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads = match args.next() {
        Some(a) => a.parse()?,
        None => std::thread::available_parallelism().map_or(1, usize::from),
    };
    let budget = match args.next() {
        Some(a) => a.parse()?,
        None => 10.0,
    };
    let probe = sluice_kernels::probe::measure(threads, budget)?;
    println!("{}", serde_json::to_string_pretty(&probe)?);
    Ok(())
}
