//! The `seckill` binary; everything lives in the library's `cli` module.

/// mimalloc, not glibc's malloc: a request allocates many small short-lived values on one worker
/// thread and frees some on another, which glibc's arenas pay for in locking and consolidation.
#[cfg(not(madsim))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    seckill_engine::cli::main()
}

#[cfg(madsim)]
fn main() {
    eprintln!("the seckill binary runs on real time; the simulation is `cargo sim`");
    std::process::exit(2);
}
