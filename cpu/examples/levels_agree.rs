//! Every SIMD level of this CPU against the portable one (`fornax_cpu::check_levels`):
//! exits non-zero when they differ. This is how the arm64 levels are checked under
//! emulation (`scripts/check-arm64.sh`).

fn main() {
    match fornax_cpu::check_levels() {
        Ok(summary) => println!("{summary}"),
        Err(e) => {
            eprintln!("levels disagree: {e}");
            std::process::exit(1);
        }
    }
}
