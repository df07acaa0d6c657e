//! Simulation tests; built only by `cargo sim`.

// `cargo sim` enables the `simulation` feature and `--cfg madsim`. If the feature arrives without
// the cfg, RUSTFLAGS in the environment has overridden the alias's rustflags and these tests
// would run on real time and threads — refuse to build instead of passing vacuously.
#[cfg(not(madsim))]
compile_error!("simulation tests need `--cfg madsim`: run `cargo sim` with RUSTFLAGS unset");

mod conformance;
mod harness;
mod scenarios;
mod smoke;
