//! Implementations of the ports. `script` is the `StockCache` shared by every Redis-speaking
//! backend; `embedded/` is the in-memory backend (always compiled: the default for `demo`, for
//! `serve` without store URLs, for tests and for the simulated nodes). The real Redis, Kafka
//! and MySQL adapters join here under `cfg(not(madsim))`.

pub mod embedded;
#[cfg(not(madsim))]
pub mod kafka;
#[cfg(not(madsim))]
pub mod mysql;
#[cfg(not(madsim))]
pub mod redis;
pub mod script;

/// PEM files for a TLS connection to a store: the CA to trust (`None`: the system's roots) and,
/// for mutual TLS, the client's certificate and key. Paths are checked when the settings are read
/// (`crate::backend`), so a typo fails at start with the variable's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A credential: compared and cloned like a string, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}
