//! The `seckill` binary; everything lives in the library's `cli` module.

/// mimalloc, not glibc's malloc: a request allocates many small short-lived values on one worker
/// thread and frees some on another, which glibc's arenas pay for in locking and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
