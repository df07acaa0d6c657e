//! `seckill serve` settings: a TOML file, then `SECKILL_*` environment variables (the
//! environment wins), then defaults. Everything is checked at start; an error names the key (or
//! the variable) it came from. Store URLs are not here: they are the `REDIS_URL` /
//! `KAFKA_BROKERS` / `DATABASE_URL` settings of `seckill_stores::backend`, shared with the other commands.

use seckill_stores::Secret;
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimits {
    /// Requests per second over the whole process (GCRA, burst = one second's worth).
    pub global_per_sec: u32,
    pub per_user_per_sec: u32,
    pub per_ip_per_sec: u32,
    /// After an activity opens, admit a share of requests rising linearly to all over this long.
    pub ramp_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// Bearer token of the admin routes; `None`: generated at start and printed once.
    pub admin_token: Option<Secret>,
    /// HMAC key of purchase tokens; `None`: random per process (one engine only).
    pub token_secret: Option<Secret>,
    pub token_ttl_ms: u64,
    pub request_timeout: Duration,
    /// How long a bucket found empty is answered "sold out" from memory before Redis is asked
    /// again. Units a rebalancing moves are sold at the next registry refresh whatever this is;
    /// units given back (cancels, failed publishes) wait up to this long.
    pub sold_out_recheck_ms: u64,
    pub body_limit_bytes: usize,
    /// The header a trusted proxy appends the client address to (`x-forwarded-for`).
    pub trusted_proxy_header: Option<String>,
    /// Peers whose forwarding header is believed; the client is the rightmost address in the
    /// header that is not one of them. Empty: the socket's address is the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The admin listener: admin routes, `/metrics`, `/readyz` (loopback by default).
    pub admin_listen: SocketAddr,
    /// How user JWTs are verified; `None`: the development key (embedded stores only).
    pub jwt: Option<JwtKeys>,
    pub jwt_issuer: Option<String>,
    pub jwt_audience: Option<String>,
    /// How often the JWKS file is read again for new keys (`jwt_jwks_file` only).
    pub jwt_jwks_reload: Duration,
    /// HMAC key of the payment provider's callbacks; `None`: callbacks are refused (503).
    pub payment_secret: Option<Secret>,
    /// During a rotation of the provider's key: the key being retired, still believed beside
    /// `payment_secret` until every callback signed with it has arrived.
    pub payment_secret_previous: Option<Secret>,
    pub rate: RateLimits,
    /// The roles this process runs (DESIGN §11.1); all three by default.
    pub roles: seckill_core::roles::Roles,
    /// Header-read timeout, connection cap, shutdown deadline of each listener.
    pub conn_limits: super::listener::ConnLimits,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_token: None,
            token_secret: None,
            token_ttl_ms: 30_000,
            // Longer than the producer's delivery timeout (3 s): a slow bus still answers "queued".
            request_timeout: Duration::from_millis(5_000),
            sold_out_recheck_ms: seckill_core::service::PurchaseConfig::default().sold_out_recheck_ms,
            body_limit_bytes: 4_096,
            trusted_proxy_header: None,
            trusted_proxies: Vec::new(),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            jwt: None,
            jwt_issuer: None,
            jwt_audience: None,
            jwt_jwks_reload: Duration::from_secs(10),
            payment_secret: None,
            payment_secret_previous: None,
            rate: RateLimits {
                global_per_sec: 200_000,
                per_user_per_sec: 5,
                per_ip_per_sec: 2_000,
                ramp_ms: 0,
            },
            roles: seckill_core::roles::Roles::ALL,
            conn_limits: super::listener::ConnLimits::default(),
        }
    }
}

/// Where the JWT verification keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKeys {
    Secret(Secret),
    /// The JWKS document's text (read at start; its path is in the error messages).
    Jwks {
        path: String,
        text: String,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    /// The TOML key (`rate_limit.per_user_per_sec`) or environment variable it came from.
    pub key: String,
    pub reason: String,
}

fn bad(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        reason: reason.into(),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    admin_token: Option<String>,
    token_secret: Option<String>,
    token_ttl_ms: Option<u64>,
    request_timeout_ms: Option<u64>,
    sold_out_recheck_ms: Option<u64>,
    body_limit_bytes: Option<u64>,
    trusted_proxy_header: Option<String>,
    trusted_proxies: Option<Vec<String>>,
    admin_listen: Option<String>,
    jwt_secret: Option<String>,
    jwt_jwks_file: Option<String>,
    jwt_issuer: Option<String>,
    jwt_audience: Option<String>,
    jwt_jwks_reload_ms: Option<u64>,
    payment_secret: Option<String>,
    payment_secret_previous: Option<String>,
    roles: Option<String>,
    header_read_timeout_ms: Option<u64>,
    max_connections: Option<u64>,
    shutdown_deadline_ms: Option<u64>,
    max_header_bytes: Option<u64>,
    max_headers: Option<u64>,
    rate_limit: Option<FileRates>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileRates {
    global_per_sec: Option<u64>,
    per_user_per_sec: Option<u64>,
    per_ip_per_sec: Option<u64>,
    ramp_ms: Option<u64>,
}

/// The settings `seckill serve` also takes as command-line flags: the last source, over the
/// environment and the file, and validated with them (a `--listen` that clashes with the admin
/// listener is refused by name, `--check-config` included).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub roles: Option<seckill_core::roles::Roles>,
}

/// Why `secret` is no secret: a placeholder of an example file or of the documentation
/// (`CHANGE-ME…`, `your-secret`, …) or a run of a few characters (`0000…`). Deployed unchanged,
/// an example's secret lets anyone who read the example mint any user's JWT or sign payment
/// callbacks. `None` for a secret somebody chose.
pub fn placeholder(secret: &str) -> Option<String> {
    const WORDS: [&str; 6] = [
        "changeme",
        "replaceme",
        "placeholder",
        "yoursecret",
        "example",
        "notasecret",
    ];
    let plain: String = (secret.chars())
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if let Some(word) = WORDS.iter().find(|w| plain.contains(*w)) {
        return Some(format!("is a placeholder (it says {word:?})"));
    }
    let distinct: std::collections::BTreeSet<char> = secret.chars().collect();
    (distinct.len() < 6).then(|| format!("is made of {} distinct characters", distinct.len()))
}

/// One setting: its TOML key, its variable, its file value.
struct Setting<'a, T> {
    key: &'a str,
    var: &'a str,
    file: Option<T>,
}

impl ServeConfig {
    /// What is allowed but probably wrong, for `serve` to say loudly at start and
    /// `--check-config` to print: a public listener off loopback that believes no proxy (behind
    /// an ingress or a load balancer, every buyer would share the proxy's address and its per-IP
    /// limit: one bot gets everyone a 429). Not refused: a listener that clients reach directly
    /// needs no proxy.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if !self.listen.ip().is_loopback() && self.trusted_proxies.is_empty() {
            w.push(format!(
                "listen {} is off loopback and trusted_proxies is empty: behind a proxy or an \
                 ingress every buyer shares its address and its per-IP limit; name the proxies in \
                 trusted_proxies (SECKILL_TRUSTED_PROXIES), unless clients connect directly",
                self.listen
            ));
        }
        w
    }

    /// From the TOML text of `--config` (if any), the environment (`env` looks a variable up)
    /// and the command line's `flags`, each source over the one before; validated once all are in.
    pub fn load(
        file: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
        flags: &Flags,
    ) -> Result<ServeConfig, ConfigError> {
        let f: FileConfig = match file {
            Some(text) => toml::from_str(text).map_err(|e| {
                // toml names unknown keys in its message; a value of the wrong type is found by
                // its span: the key is what stands before `=` on that line.
                let key = e
                    .span()
                    .and_then(|span| text.get(..span.start))
                    .and_then(|before| before.rsplit('\n').next())
                    .and_then(|line| line.split('=').next())
                    .map(|k| k.trim().trim_matches('"'))
                    .filter(|k| !k.is_empty() && !k.starts_with('['))
                    .unwrap_or("config");
                bad(key, e.message().trim())
            })?,
            None => FileConfig::default(),
        };
        let rates = f.rate_limit.unwrap_or_default();
        let d = ServeConfig::default();
        // One numeric setting: its TOML key, its variable, its file value, its range, its default.
        let num = |key: &str,
                   var: &str,
                   file: Option<u64>,
                   range: std::ops::RangeInclusive<u64>,
                   default: u64|
         -> Result<u64, ConfigError> {
            let s = Setting { key, var, file };
            let (name, v) = match env(s.var) {
                Some(text) => (
                    s.var,
                    text.trim()
                        .parse::<u64>()
                        .map_err(|_| bad(s.var, format!("{text:?} is not a whole number")))?,
                ),
                None => (s.key, s.file.unwrap_or(default)),
            };
            if !range.contains(&v) {
                return Err(bad(
                    name,
                    format!("must be in {}..={}, got {v}", range.start(), range.end()),
                ));
            }
            Ok(v)
        };
        let text = |s: Setting<String>| -> Option<(String, String)> {
            env(s.var)
                .map(|v| (s.var.to_string(), v))
                .or(s.file.map(|v| (s.key.to_string(), v)))
        };
        // An address and the name of the source it came from (the flag, the variable, the key).
        let address = |flag: (&str, Option<SocketAddr>),
                       key: &str,
                       var: &str,
                       file: Option<String>,
                       default: SocketAddr|
         -> Result<(String, SocketAddr), ConfigError> {
            if let (name, Some(addr)) = flag {
                return Ok((name.to_string(), addr));
            }
            match text(Setting { key, var, file }) {
                Some((name, v)) => match v.parse() {
                    Ok(addr) => Ok((name, addr)),
                    Err(_) => Err(bad(&name, format!("{v:?} is not an address like 127.0.0.1:8080"))),
                },
                None => Ok((key.to_string(), default)),
            }
        };
        let (listen_from, listen) = address(
            ("--listen", flags.listen),
            "listen",
            "SECKILL_LISTEN",
            f.listen,
            d.listen,
        )?;
        let (admin_from, admin_listen) = address(
            ("--admin-listen", flags.admin_listen),
            "admin_listen",
            "SECKILL_ADMIN_LISTEN",
            f.admin_listen,
            d.admin_listen,
        )?;
        if admin_listen == listen {
            return Err(bad(
                &admin_from,
                format!("{admin_listen} is the public listener's address ({listen_from})"),
            ));
        }
        let secret =
            |key: &str, var: &str, file: Option<String>, min: usize| -> Result<Option<Secret>, ConfigError> {
                match text(Setting { key, var, file }) {
                    Some((name, v)) if v.len() < min => {
                        Err(bad(&name, format!("must be at least {min} bytes")))
                    }
                    other => Ok(other.map(|(_, v)| Secret(v))),
                }
            };
        let admin_token = secret("admin_token", "SECKILL_ADMIN_TOKEN", f.admin_token, 16)?;
        let token_secret = secret(
            "token_secret",
            "SECKILL_TOKEN_SECRET",
            f.token_secret,
            super::token::MIN_SECRET_LEN,
        )?;
        let jwt_secret = secret(
            "jwt_secret",
            "SECKILL_JWT_SECRET",
            f.jwt_secret,
            super::identity::MIN_SECRET_LEN,
        )?;
        let jwks = text(Setting {
            key: "jwt_jwks_file",
            var: "SECKILL_JWT_JWKS_FILE",
            file: f.jwt_jwks_file,
        });
        let jwt = match (jwt_secret, jwks) {
            (Some(_), Some((name, _))) => {
                return Err(bad(&name, "set either jwt_secret or jwt_jwks_file, not both"))
            }
            (Some(s), None) => Some(JwtKeys::Secret(s)),
            (None, Some((name, path))) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| bad(&name, format!("cannot read {path}: {e}")))?;
                // Checked now, so that a bad key set stops the start with its name.
                super::identity::Identity::jwks(&text, None, None)
                    .map_err(|e| bad(&name, format!("{path}: {e}")))?;
                Some(JwtKeys::Jwks { path, text })
            }
            (None, None) => None,
        };
        let claim = |key: &str, var: &str, file: Option<String>| -> Result<Option<String>, ConfigError> {
            match text(Setting { key, var, file }) {
                Some((name, v)) if v.trim().is_empty() => Err(bad(&name, "must not be empty")),
                other => Ok(other.map(|(_, v)| v)),
            }
        };
        let jwt_issuer = claim("jwt_issuer", "SECKILL_JWT_ISSUER", f.jwt_issuer)?;
        let jwt_audience = claim("jwt_audience", "SECKILL_JWT_AUDIENCE", f.jwt_audience)?;
        let payment_secret = secret("payment_secret", "SECKILL_PAYMENT_SECRET", f.payment_secret, 16)?;
        let payment_secret_previous = secret(
            "payment_secret_previous",
            "SECKILL_PAYMENT_SECRET_PREVIOUS",
            f.payment_secret_previous,
            16,
        )?;
        if payment_secret_previous.is_some() && payment_secret.is_none() {
            return Err(bad(
                "payment_secret_previous",
                "set without payment_secret: it is believed beside the current key, not instead",
            ));
        }
        let trusted_proxies = {
            let (name, list) = match (env("SECKILL_TRUSTED_PROXIES"), f.trusted_proxies) {
                (Some(v), _) => (
                    "SECKILL_TRUSTED_PROXIES",
                    v.split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect(),
                ),
                (None, Some(list)) => ("trusted_proxies", list),
                (None, None) => ("trusted_proxies", Vec::new()),
            };
            list.iter()
                .map(|c| {
                    // A bare address is a one-address range.
                    c.parse::<ipnet::IpNet>()
                        .or_else(|_| c.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                        .map_err(|_| bad(name, format!("{c:?} is not a CIDR range like 10.0.0.0/8")))
                })
                .collect::<Result<Vec<_>, _>>()?
        };
        let header = match text(Setting {
            key: "trusted_proxy_header",
            var: "SECKILL_TRUSTED_PROXY_HEADER",
            file: f.trusted_proxy_header,
        }) {
            Some((name, v)) => {
                let v = v.trim().to_ascii_lowercase();
                if v.is_empty() || !v.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
                    return Err(bad(&name, format!("{v:?} is not a header name")));
                }
                Some(v)
            }
            None if !trusted_proxies.is_empty() => Some("x-forwarded-for".to_string()),
            None => None,
        };
        if header.is_some() && trusted_proxies.is_empty() {
            return Err(bad(
                "trusted_proxies",
                "a trusted_proxy_header needs the proxies' ranges: from any other peer it is spoofable",
            ));
        }
        let roles = match (flags.roles, env("SECKILL_ROLES"), f.roles) {
            (Some(roles), _, _) => roles,
            (None, Some(v), _) => {
                seckill_core::roles::Roles::parse(&v).map_err(|e| bad("SECKILL_ROLES", e))?
            }
            (None, None, Some(v)) => seckill_core::roles::Roles::parse(&v).map_err(|e| bad("roles", e))?,
            (None, None, None) => d.roles,
        };
        let per_sec = 1..=10_000_000;
        Ok(ServeConfig {
            listen,
            admin_token,
            token_secret,
            token_ttl_ms: num(
                "token_ttl_ms",
                "SECKILL_TOKEN_TTL_MS",
                f.token_ttl_ms,
                1_000..=600_000,
                d.token_ttl_ms,
            )?,
            request_timeout: Duration::from_millis(num(
                "request_timeout_ms",
                "SECKILL_REQUEST_TIMEOUT_MS",
                f.request_timeout_ms,
                10..=60_000,
                d.request_timeout.as_millis() as u64,
            )?),
            sold_out_recheck_ms: num(
                "sold_out_recheck_ms",
                "SECKILL_SOLD_OUT_RECHECK_MS",
                f.sold_out_recheck_ms,
                10..=60_000,
                d.sold_out_recheck_ms,
            )?,
            body_limit_bytes: num(
                "body_limit_bytes",
                "SECKILL_BODY_LIMIT_BYTES",
                f.body_limit_bytes,
                256..=1 << 20,
                d.body_limit_bytes as u64,
            )? as usize,
            trusted_proxy_header: header,
            trusted_proxies,
            admin_listen,
            jwt,
            jwt_issuer,
            jwt_audience,
            jwt_jwks_reload: Duration::from_millis(num(
                "jwt_jwks_reload_ms",
                "SECKILL_JWT_JWKS_RELOAD_MS",
                f.jwt_jwks_reload_ms,
                100..=3_600_000,
                d.jwt_jwks_reload.as_millis() as u64,
            )?),
            payment_secret,
            payment_secret_previous,
            rate: RateLimits {
                global_per_sec: num(
                    "rate_limit.global_per_sec",
                    "SECKILL_RATE_GLOBAL_PER_SEC",
                    rates.global_per_sec,
                    per_sec.clone(),
                    d.rate.global_per_sec as u64,
                )? as u32,
                per_user_per_sec: num(
                    "rate_limit.per_user_per_sec",
                    "SECKILL_RATE_PER_USER_PER_SEC",
                    rates.per_user_per_sec,
                    per_sec.clone(),
                    d.rate.per_user_per_sec as u64,
                )? as u32,
                per_ip_per_sec: num(
                    "rate_limit.per_ip_per_sec",
                    "SECKILL_RATE_PER_IP_PER_SEC",
                    rates.per_ip_per_sec,
                    per_sec,
                    d.rate.per_ip_per_sec as u64,
                )? as u32,
                ramp_ms: num(
                    "rate_limit.ramp_ms",
                    "SECKILL_RATE_RAMP_MS",
                    rates.ramp_ms,
                    0..=600_000,
                    d.rate.ramp_ms,
                )?,
            },
            roles,
            conn_limits: super::listener::ConnLimits {
                header_read_timeout: Duration::from_millis(num(
                    "header_read_timeout_ms",
                    "SECKILL_HEADER_READ_TIMEOUT_MS",
                    f.header_read_timeout_ms,
                    100..=600_000,
                    d.conn_limits.header_read_timeout.as_millis() as u64,
                )?),
                max_connections: num(
                    "max_connections",
                    "SECKILL_MAX_CONNECTIONS",
                    f.max_connections,
                    1..=1_000_000,
                    d.conn_limits.max_connections as u64,
                )? as usize,
                shutdown_deadline: Duration::from_millis(num(
                    "shutdown_deadline_ms",
                    "SECKILL_SHUTDOWN_DEADLINE_MS",
                    f.shutdown_deadline_ms,
                    0..=600_000,
                    d.conn_limits.shutdown_deadline.as_millis() as u64,
                )?),
                // hyper refuses a read buffer under 8 KiB.
                max_header_bytes: num(
                    "max_header_bytes",
                    "SECKILL_MAX_HEADER_BYTES",
                    f.max_header_bytes,
                    8_192..=1 << 20,
                    d.conn_limits.max_header_bytes as u64,
                )? as usize,
                max_headers: num(
                    "max_headers",
                    "SECKILL_MAX_HEADERS",
                    f.max_headers,
                    8..=1_000,
                    d.conn_limits.max_headers as u64,
                )? as usize,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(file: &str, env: &[(&str, &str)]) -> Result<ServeConfig, ConfigError> {
        load_with(file, env, &Flags::default())
    }

    fn load_with(file: &str, env: &[(&str, &str)], flags: &Flags) -> Result<ServeConfig, ConfigError> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ServeConfig::load(
            Some(file),
            |k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            flags,
        )
    }

    #[test]
    fn secrets_are_never_printed() {
        let c = load(
            "admin_token = \"adm-1x9q-0123456789\"\njwt_secret = \"jwt-8v7w-0123456789abcdefghijklmnopq\"\n\
             payment_secret = \"pay-5t4r-0123456789\"\ntoken_secret = \"tok-3e2d-0123456789abcdefghijklmnopq\"",
            &[],
        )
        .unwrap();
        let shown = format!("{c:?}");
        for secret in ["adm-1x9q", "jwt-8v7w", "pay-5t4r", "tok-3e2d"] {
            assert!(!shown.contains(secret), "{secret} printed: {shown}");
        }
        assert_eq!(c.admin_token.as_deref(), Some("adm-1x9q-0123456789"));
    }

    #[test]
    fn placeholders_are_told_from_chosen_secrets() {
        for fake in [
            "CHANGE-ME-admin-token-0000000000",
            "change_me_please_0123456789abcdef",
            "your-secret-here-0123456789",
            "00000000000000000000000000000000",
            "abababababababababababab",
            "an-Example-secret-0123456789",
        ] {
            assert!(placeholder(fake).is_some(), "{fake}");
        }
        for real in [
            "runbook-jwt-secret-0123456789abcdefghij",
            "3f9c1e7a5b2d4c8e9a0b1c2d3e4f5a6b",
            "admin-token-processes-0123456789",
        ] {
            assert_eq!(placeholder(real), None, "{real}");
        }
    }

    #[test]
    fn flags_come_last_and_are_validated_with_the_rest() {
        let flags = |listen: &str| Flags {
            listen: Some(listen.parse().unwrap()),
            ..Flags::default()
        };
        let c = load_with(
            "listen = \"127.0.0.1:9000\"",
            &[("SECKILL_LISTEN", "127.0.0.1:9100")],
            &flags("127.0.0.1:9200"),
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9200, "the flag wins");
        // The admin listener's default is 127.0.0.1:9090: a --listen on it is refused, named.
        let e = load_with("", &[], &flags("127.0.0.1:9090")).unwrap_err();
        assert_eq!(e.key, "admin_listen");
        assert!(e.reason.contains("(--listen)"), "{}", e.reason);
        let e = load_with(
            "listen = \"127.0.0.1:9300\"",
            &[],
            &Flags {
                admin_listen: Some("127.0.0.1:9300".parse().unwrap()),
                ..Flags::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.reason.contains("(listen)")),
            ("--admin-listen", true)
        );
        let roles = seckill_core::roles::Roles::parse("jobs").unwrap();
        let c = load_with(
            "roles = \"api\"",
            &[],
            &Flags {
                roles: Some(roles),
                ..Flags::default()
            },
        )
        .unwrap();
        assert_eq!(c.roles, roles);
    }

    #[test]
    fn file_then_environment_then_defaults() {
        let c = load(
            "listen = \"127.0.0.1:9000\"\n[rate_limit]\nper_user_per_sec = 3\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.rate.per_user_per_sec, 3);
        assert_eq!(c.token_ttl_ms, 30_000);
        assert_eq!(c.sold_out_recheck_ms, 200);
        let c = load(
            "listen = \"127.0.0.1:9000\"",
            &[("SECKILL_LISTEN", "127.0.0.1:9100")],
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9100, "the environment wins");
    }

    #[test]
    fn every_bad_setting_names_its_key() {
        let key = |file: &str, env: &[(&str, &str)]| load(file, env).unwrap_err().key;
        assert_eq!(key("listen = \"nowhere\"", &[]), "listen");
        assert_eq!(key("", &[("SECKILL_LISTEN", "x")]), "SECKILL_LISTEN");
        assert_eq!(
            key("[rate_limit]\nper_user_per_sec = 0", &[]),
            "rate_limit.per_user_per_sec"
        );
        assert_eq!(
            key("", &[("SECKILL_RATE_PER_IP_PER_SEC", "-5")]),
            "SECKILL_RATE_PER_IP_PER_SEC"
        );
        assert_eq!(key("token_ttl_ms = 5", &[]), "token_ttl_ms");
        assert_eq!(key("sold_out_recheck_ms = 0", &[]), "sold_out_recheck_ms");
        assert_eq!(
            key("", &[("SECKILL_SOLD_OUT_RECHECK_MS", "600001")]),
            "SECKILL_SOLD_OUT_RECHECK_MS"
        );
        assert_eq!(key("admin_token = \"short\"", &[]), "admin_token");
        assert_eq!(
            key("", &[("SECKILL_TOKEN_SECRET", "short")]),
            "SECKILL_TOKEN_SECRET"
        );
        assert_eq!(key("trusted_proxy_header = \"x y\"", &[]), "trusted_proxy_header");
        assert_eq!(
            key("trusted_proxy_header = \"x-real-ip\"", &[]),
            "trusted_proxies"
        );
        assert_eq!(key("trusted_proxies = [\"10.0.0.0/33\"]", &[]), "trusted_proxies");
        assert_eq!(
            key("", &[("SECKILL_TRUSTED_PROXIES", "10.0.0.1, x")]),
            "SECKILL_TRUSTED_PROXIES"
        );
        assert_eq!(key("admin_listen = \"127.0.0.1:8080\"", &[]), "admin_listen");
        assert_eq!(key("", &[("SECKILL_JWT_SECRET", "short")]), "SECKILL_JWT_SECRET");
        assert_eq!(
            key("jwt_jwks_file = \"/nonexistent/jwks.json\"", &[]),
            "jwt_jwks_file"
        );
        assert_eq!(
            key(
                &format!("jwt_secret = \"{}\"\njwt_jwks_file = \"/x\"", "s".repeat(32)),
                &[]
            ),
            "jwt_jwks_file"
        );
        assert_eq!(key("jwt_issuer = \" \"", &[]), "jwt_issuer");
        assert_eq!(key("payment_secret = \"short\"", &[]), "payment_secret");
        let c = load("trusted_proxies = [\"10.0.0.0/8\", \"fd00::1\"]", &[]).unwrap();
        assert_eq!(c.trusted_proxy_header.as_deref(), Some("x-forwarded-for"));
        assert_eq!(c.trusted_proxies.len(), 2);
        assert_eq!(key("", &[("SECKILL_ROLES", "api,maybe")]), "SECKILL_ROLES");
        assert_eq!(key("roles = \"api,api\"", &[]), "roles");
        assert_eq!(
            load("roles = \"worker\"", &[("SECKILL_ROLES", "api,jobs")])
                .unwrap()
                .roles
                .to_string(),
            "api,jobs",
            "the environment wins"
        );
        let e = load("lisen = \"127.0.0.1:1\"", &[]).unwrap_err();
        assert!(e.reason.contains("lisen"), "{e}");
        assert_eq!(key("body_limit_bytes = \"big\"", &[]), "body_limit_bytes");
    }

    #[test]
    fn a_previous_payment_key_needs_a_current_one() {
        let c = load(
            "payment_secret = \"pay-new-5t4r-0123456789\"\npayment_secret_previous = \"pay-old-9k8j-0123456789\"",
            &[],
        )
        .unwrap();
        assert_eq!(
            c.payment_secret_previous.as_deref(),
            Some("pay-old-9k8j-0123456789")
        );
        assert!(
            !format!("{c:?}").contains("pay-old"),
            "the old key is a secret too"
        );
        let e = load("payment_secret_previous = \"pay-old-9k8j-0123456789\"", &[]).unwrap_err();
        assert_eq!(e.key, "payment_secret_previous");
        let e = load(
            "",
            &[
                ("SECKILL_PAYMENT_SECRET", "pay-new-5t4r-0123456789"),
                ("SECKILL_PAYMENT_SECRET_PREVIOUS", "short"),
            ],
        )
        .unwrap_err();
        assert_eq!(e.key, "SECKILL_PAYMENT_SECRET_PREVIOUS");
    }

    #[test]
    fn a_public_listener_that_believes_no_proxy_is_warned_about() {
        let c = load("listen = \"0.0.0.0:8080\"", &[]).unwrap();
        let w = c.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("trusted_proxies is empty"), "{w:?}");
        let c = load(
            "listen = \"0.0.0.0:8080\"\ntrusted_proxies = [\"10.0.0.0/8\"]",
            &[],
        )
        .unwrap();
        assert_eq!(c.warnings(), Vec::<String>::new());
        let c = load("listen = \"127.0.0.1:8080\"", &[]).unwrap();
        assert_eq!(c.warnings(), Vec::<String>::new());
    }
}
