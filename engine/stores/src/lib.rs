//! seckill-stores: the real stores behind the ports — Redis (`redis`: the `StockCache` through
//! `seckill_core::adapters::script`, token nonces, the shared rate limits), Kafka (`kafka`: the
//! `OrderBus` and `OrderSource`) and MySQL (`mysql`: the `Ledger`) — and `backend`, which picks
//! the stores a command runs on from its settings. The only crate that names a store client
//! (`redis`, `rdkafka`, `sqlx`): `ci/deps.sh` fails the build if another one does.

pub mod backend;
pub mod kafka;
pub mod mysql;
pub mod redis;
pub mod strategies;

/// PEM files for a TLS connection to a store: the CA to trust (`None`: the system's roots) and,
/// for mutual TLS, the client's certificate and key. Paths are checked when the settings are read
/// (`crate::backend`), so a typo fails at start with the variable's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: Option<std::path::PathBuf>,
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A store URL fit for an error message, as written but for its password (`***`).
pub fn redacted(u: &str) -> String {
    let Some((scheme, rest)) = u.split_once("://") else {
        return u.to_string();
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    match authority
        .rfind('@')
        .map(|at| (at, authority[..at].split_once(':')))
    {
        Some((at, Some((user, _)))) => format!("{scheme}://{user}:***{}", &rest[at..]),
        _ => u.to_string(),
    }
}

/// A credential: compared and cloned like a string, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Read as the string it holds where a key is needed (`secret.as_bytes()`); only `Debug` hides it.
impl std::ops::Deref for Secret {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_string())
    }
}
