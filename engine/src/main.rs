//! The `seckill` binary; everything lives in the library's `cli` module.

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    seckill_engine::cli::main()
}

#[cfg(madsim)]
fn main() {
    eprintln!("the seckill binary runs on real time; the simulation is `cargo sim`");
    std::process::exit(2);
}
