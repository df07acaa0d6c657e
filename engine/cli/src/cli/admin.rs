//! `seckill admin`: the operator's calls to a running server's admin listener, as subcommands —
//! what the runbook did with `curl`. The token is the server's admin token, from
//! `SECKILL_ADMIN_TOKEN` or `--token-file`.
//!
//! Exit codes a script can use: 0 the server did it (a 2xx answer); 1 the server refused it (its
//! status and error are printed); 2 the call could not be made (a bad flag or file, no token,
//! the listener unreachable).

use super::client::Conn;
use super::tools::runtime_multi;
use seckill_core::domain::ReservationId;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct AdminArgs {
    /// The admin listener of any API process (SECKILL_ADMIN_URL; default http://127.0.0.1:9090).
    #[arg(long)]
    url: Option<String>,
    /// A file holding the admin token (default: SECKILL_ADMIN_TOKEN or SECKILL_ADMIN_TOKEN_FILE,
    /// as `serve` reads them).
    #[arg(long = "token-file")]
    token_file: Option<PathBuf>,
    /// Print the server's answer as it came, one JSON object.
    #[arg(long, global = true)]
    json: bool,
    /// Wait up to this many seconds for the listener to accept (a server just started).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
    wait: u64,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(clap::Subcommand)]
enum AdminCommand {
    /// Create (and warm) an activity from a JSON file of the admin API's spec (id, total_stock,
    /// buckets, fallback_pct, start_ms, end_ms, pay_timeout_ms, unit_price_minor).
    Create {
        /// The spec file ("-": standard input).
        file: PathBuf,
    },
    /// Every installed activity: id, the operator's intent (state, version, generation), stock,
    /// window.
    List,
    /// One activity: its intent and spec, and per bucket the stock, the open reservations and
    /// the gate in Redis now, and whether a recovery holds it.
    Show(Activity),
    /// Warm an installed activity's stock in Redis (a recovery when the ledger has orders).
    Warmup(Activity),
    /// Pause the sale: after the call returns, no reserve anywhere succeeds.
    Pause(Activity),
    /// Resume a paused sale.
    Resume(Activity),
    /// Close the sale for good.
    Close(Activity),
    /// Run one reconciler pass over the activity and print what it did.
    Reconcile(Activity),
    /// The activity's invariants (S1-S3, and R1 when at rest); exit 1 if one is violated.
    Audit(Activity),
    /// One user's order in an activity.
    Order {
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        activity: u64,
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        user: u64,
    },
    /// Cancel an order by its reservation id (its unit goes back on sale).
    Cancel {
        /// The reservation id (32 lowercase hex digits), as `order` shows it.
        reservation: String,
    },
    /// The dead-letter topic: records the order consumer could not apply, and why.
    #[command(subcommand, name = "dead-letters", visible_alias = "dlq")]
    DeadLetters(DeadLetterCommand),
}

#[derive(clap::Subcommand)]
enum DeadLetterCommand {
    /// The dead letters, oldest first, with their reasons.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: u64,
    },
    /// One dead letter in full.
    Show {
        /// PARTITION/OFFSET, as `list` shows it.
        #[arg(value_parser = position)]
        at: (u32, u64),
    },
    /// Publish one dead letter, or every one, to the order topic again. A reservation the ledger
    /// holds already is left alone, so a replay may be run again; the letters stay until purged.
    Replay {
        /// PARTITION/OFFSET, as `list` shows it.
        #[arg(value_parser = position, required_unless_present = "all", conflicts_with = "all")]
        at: Option<(u32, u64)>,
        /// Every dead letter the topic holds now.
        #[arg(long)]
        all: bool,
    },
    /// Delete every dead letter the topic holds now (any that arrive meanwhile stay). Asks for
    /// confirmation on a terminal.
    Purge {
        /// Do not ask (a script's confirmation).
        #[arg(long)]
        yes: bool,
    },
}

/// The purge `dead-letters purge` makes once confirmed (after a listing: `call_of`).
const PURGE: &str = "/api/v1/admin/dead-letters/purge";

/// `PARTITION/OFFSET` of a dead letter.
fn position(s: &str) -> Result<(u32, u64), String> {
    let bad =
        || format!("expected PARTITION/OFFSET (two whole numbers, as `dead-letters list` shows), got {s:?}");
    let (p, o) = s.split_once('/').ok_or_else(bad)?;
    Ok((p.parse().map_err(|_| bad())?, o.parse().map_err(|_| bad())?))
}

#[derive(clap::Args)]
struct Activity {
    /// The activity id.
    #[arg(value_parser = clap::value_parser!(u64).range(1..))]
    activity: u64,
}

/// The admin listener's address from `http://HOST:PORT[/]`.
fn listener(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!("--url {url:?}: expected http://HOST:PORT (the admin listener serves plain HTTP on a private network)")
    })?;
    let host_port = rest.trim_end_matches('/');
    match host_port.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() && !host_port.contains('/') => {
            Ok(host_port.to_string())
        }
        _ => Err(format!("--url {url:?}: expected http://HOST:PORT")),
    }
}

/// The admin token: `--token-file`, else `SECKILL_ADMIN_TOKEN` as `serve` reads it (the variable,
/// `SECKILL_ADMIN_TOKEN_FILE`, or systemd's credentials directory).
fn token(file: Option<&PathBuf>) -> Result<String, String> {
    use seckill_stores::backend::{lookup, read_secret_file};
    let token = match file {
        Some(path) => read_secret_file(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?,
        None => lookup().map_err(|e| e.to_string())?("SECKILL_ADMIN_TOKEN")
            .ok_or("SECKILL_ADMIN_TOKEN: not set (nor SECKILL_ADMIN_TOKEN_FILE; or pass --token-file)")?,
    };
    if token.trim().is_empty() {
        return Err(match file {
            Some(path) => format!("--token-file {}: empty", path.display()),
            None => "SECKILL_ADMIN_TOKEN: empty".into(),
        });
    }
    Ok(token)
}

/// The call a subcommand makes: method, path, body.
fn call_of(command: &AdminCommand) -> Result<(&'static str, String, String), String> {
    let on = |id: u64, what: &str| {
        (
            "POST",
            format!("/api/v1/admin/activities/{id}/{what}"),
            String::new(),
        )
    };
    Ok(match command {
        AdminCommand::Create { file } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).map_err(|e| format!("standard input: {e}"))?
            } else {
                std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?
            };
            // Refused here if it is not JSON at all; the server names a bad or missing field.
            serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
            ("POST", "/api/v1/admin/activities".into(), text)
        }
        AdminCommand::List => ("GET", "/api/v1/admin/activities".into(), String::new()),
        AdminCommand::Show(a) => (
            "GET",
            format!("/api/v1/admin/activities/{}", a.activity),
            String::new(),
        ),
        AdminCommand::Warmup(a) => on(a.activity, "warmup"),
        AdminCommand::Pause(a) => on(a.activity, "pause"),
        AdminCommand::Resume(a) => on(a.activity, "resume"),
        AdminCommand::Close(a) => on(a.activity, "close"),
        AdminCommand::Reconcile(a) => on(a.activity, "reconcile"),
        AdminCommand::Audit(a) => (
            "GET",
            format!("/api/v1/admin/activities/{}/audit", a.activity),
            String::new(),
        ),
        AdminCommand::Order { activity, user } => (
            "GET",
            format!("/api/v1/admin/activities/{activity}/orders/{user}"),
            String::new(),
        ),
        AdminCommand::Cancel { reservation } => {
            let id: ReservationId = reservation.parse().map_err(|e| format!("reservation: {e}"))?;
            ("POST", format!("/api/v1/admin/orders/{id}/cancel"), String::new())
        }
        AdminCommand::DeadLetters(c) => match c {
            DeadLetterCommand::List { limit } => (
                "GET",
                format!("/api/v1/admin/dead-letters?limit={limit}"),
                String::new(),
            ),
            DeadLetterCommand::Show { at: (p, o) } => (
                "GET",
                format!("/api/v1/admin/dead-letters/{p}/{o}"),
                String::new(),
            ),
            DeadLetterCommand::Replay { at, .. } => {
                let body = match at {
                    Some((p, o)) => serde_json::json!({ "partition": p, "offset": o }),
                    None => serde_json::json!({ "all": true }),
                };
                (
                    "POST",
                    "/api/v1/admin/dead-letters/replay".into(),
                    body.to_string(),
                )
            }
            // What there is to purge first; the purge itself follows the confirmation.
            DeadLetterCommand::Purge { .. } => {
                ("GET", "/api/v1/admin/dead-letters?limit=1".into(), String::new())
            }
        },
    })
}

/// An answer for a person: a JSON object as `key: value` lines (nested values as JSON), anything
/// else as it came.
fn human(body: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("{k}: {s}"),
                other => format!("{k}: {other}"),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => body.trim().to_string(),
    }
}

/// `list`'s answer as a table, one activity a line.
fn activities_table(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let mut out = format!(
        "{:>12} {:<8} {:>7} {:>10} {:>9} {:>7} {:>15} {:>15}",
        "id", "state", "version", "generation", "stock", "buckets", "start_ms", "end_ms"
    );
    // (A JSON value's Display ignores widths: each is made text first.)
    let t = |v: &serde_json::Value| v.to_string();
    for r in v["activities"].as_array()? {
        let (a, i) = (&r["activity"], &r["intent"]);
        out += &format!(
            "\n{:>12} {:<8} {:>7} {:>10} {:>9} {:>7} {:>15} {:>15}",
            t(&a["id"]),
            i["state"].as_str()?,
            t(&i["version"]),
            t(&i["generation"]),
            t(&a["total_stock"]),
            t(&a["buckets"]),
            t(&a["start_ms"]),
            t(&a["end_ms"])
        );
    }
    Some(out)
}

/// `show`'s answer: the activity's lines, then its buckets as a table.
fn activity_table(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let (a, i) = (&v["activity"], &v["intent"]);
    let mut out = format!(
        "activity {}: {} (version {}, generation {}){}\n{} units in {} buckets, {}% in the fallback; window {} .. {} ms\n",
        a["id"],
        i["state"].as_str()?,
        i["version"],
        i["generation"],
        if v["recovering"] == true { "; a recovery holds it" } else { "" },
        a["total_stock"],
        a["buckets"],
        a["fallback_pct"],
        a["start_ms"],
        a["end_ms"],
    );
    let f = &v["funnel"];
    out += &format!(
        "funnel: {} units: {} in Redis, {} queued, {} sold ({} cancelled orders); consumer lag {}\n",
        f["units"], f["in_redis"], f["queued"], f["sold"], f["cancelled_orders"], f["consumer_lag"]
    );
    // A recovery under way, or one that left gates behind the registry's generation.
    let (r, buckets) = (&v["recovery"], v["buckets"].as_array()?.len() as u64);
    if !r["claim"].is_null() || r["gates_at_generation"].as_u64() != Some(buckets) {
        out += &format!(
            "recovery: claim {}; {} of {buckets} gates recovering, {} at generation {}, {} missing\n",
            r["claim"].as_str().unwrap_or("none"),
            r["gates_recovering"],
            r["gates_at_generation"],
            i["generation"],
            r["gates_missing"],
        );
    }
    out += &format!(
        "{:>6} {:>9} {:>9} {:>6} {:>9} gate",
        "bucket", "initial", "stock", "open", "sold"
    );
    for b in v["buckets"].as_array()? {
        let gate = match &b["gate"] {
            serde_json::Value::Null => "missing".to_string(),
            g => format!("{} g{}", g["state"].as_str().unwrap_or("?"), g["generation"]),
        };
        let stock = match &b["stock"] {
            serde_json::Value::Null => "missing".to_string(),
            n => n.to_string(),
        };
        out += &format!(
            "\n{:>6} {:>9} {:>9} {:>6} {:>9} {gate}",
            b["bucket"].to_string(),
            b["initial"].to_string(),
            stock,
            b["open_reservations"].to_string(),
            b["sold"].to_string(),
        );
    }
    Some(out)
}

/// `dead-letters list`'s answer, one letter a line.
fn dead_letters_table(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let letters = v["dead_letters"].as_array()?;
    let mut out = format!("{} of {} dead letters", letters.len(), v["total"]);
    if let Some(next) = v["next"].as_object() {
        out += &format!(" (more from {}/{})", next.get("partition")?, next.get("offset")?);
    }
    for d in letters {
        out += &format!(
            "\n{:>12}  {}  key {}  {}",
            format!("{}/{}", d["partition"], d["offset"]),
            d["origin"].as_str()?,
            d["key"].as_str()?,
            d["reason"].as_str()?
        );
    }
    Some(out)
}

/// `dead-letters replay`'s answer: the counts, then each letter's outcome.
fn replay_table(body: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let mut out = format!(
        "replayed {}, already orders {}, undecodable {}",
        v["replayed"], v["already_orders"], v["undecodable"]
    );
    for d in v["letters"].as_array()? {
        out += &format!(
            "\n{:>12}  {}",
            format!("{}/{}", d["partition"], d["offset"]),
            d["outcome"].as_str()?
        );
        if !d["detail"].is_null() {
            out += &format!(" ({})", d["detail"].as_str().unwrap_or(&d["detail"].to_string()));
        }
    }
    Some(out)
}

/// Whether the operator confirms purging `total` dead letters: `--yes`, or "yes" typed on a
/// terminal; without either the purge is not made.
fn confirm_purge(total: u64, yes: bool) -> Result<(), String> {
    use std::io::{IsTerminal, Write};
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "purge: {total} dead letters would be deleted; confirm with --yes (no terminal to ask on)"
        ));
    }
    eprint!("delete {total} dead letters for good? type yes: ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| format!("standard input: {e}"))?;
    match answer.trim() {
        "yes" => Ok(()),
        _ => Err("purge: not confirmed; nothing deleted".into()),
    }
}

/// The server's reason for a refusal: its error's code, the field it names and its message.
fn refusal(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let e = &v["error"];
    match (e["code"].as_str(), e["field"].as_str(), e["message"].as_str()) {
        (Some(c), Some(f), Some(m)) => format!("{c}: {f}: {m}"),
        (Some(c), None, Some(m)) => format!("{c}: {m}"),
        _ => human(body).replace('\n', "; "),
    }
}

pub fn run(args: AdminArgs) -> ExitCode {
    let usage = |e: String| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    };
    let url = args
        .url
        .or_else(|| std::env::var("SECKILL_ADMIN_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:9090".into());
    let (addr, token, (method, path, body)) = match (
        listener(&url),
        token(args.token_file.as_ref()),
        call_of(&args.command),
    ) {
        (Ok(a), Ok(t), Ok(c)) => (a, t, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return usage(e),
    };
    let runtime = match runtime_multi() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let purge = match &args.command {
        AdminCommand::DeadLetters(DeadLetterCommand::Purge { yes }) => Some(*yes),
        _ => None,
    };
    let answer = runtime.block_on(async {
        let to = tokio::net::lookup_host(&addr)
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| format!("--url {url:?}: cannot resolve {addr}"))?;
        let mut conn = Conn::new(to);
        let wait_until = tokio::time::Instant::now() + std::time::Duration::from_secs(args.wait);
        let mut call = async |method: &str, path: &str, body: &str| {
            let status = loop {
                match conn.request(method, path, &token, body).await {
                    Err(e)
                        if e.kind() == std::io::ErrorKind::ConnectionRefused
                            && tokio::time::Instant::now() < wait_until =>
                    {
                        tokio::time::sleep(std::time::Duration::from_millis(250)).await
                    }
                    answer => break answer.map_err(|e| format!("{method} {path} on {url}: {e}"))?,
                }
            };
            let body = String::from_utf8_lossy(&conn.body).into_owned();
            Ok::<_, String>((format!("{method} {path}"), status, body))
        };
        let (called, status, listed) = call(method, &path, &body).await?;
        let Some(yes) = purge.filter(|_| (200..300).contains(&status)) else {
            return Ok((called, status, listed));
        };
        // A purge: what the listing counted, confirmed, then deleted below its ends.
        let listed: serde_json::Value = serde_json::from_str(&listed).map_err(|e| format!("{path}: {e}"))?;
        let total = listed["total"].as_u64().unwrap_or(0);
        if total == 0 {
            return Ok((called, status, r#"{"purged":0}"#.to_string()));
        }
        confirm_purge(total, yes)?;
        let before = serde_json::json!({ "before": listed["purge_before"] }).to_string();
        call("POST", PURGE, &before).await
    });
    let (called, status, body) = match answer {
        Ok(a) => a,
        Err(e) => return usage(e),
    };
    let refused = !(200..300).contains(&status);
    // An audit that found a violation answers 200 with its verdict: a script must see it too.
    let violated = matches!(args.command, AdminCommand::Audit(_))
        && serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| v["verdict"] != "ok");
    match (args.json, refused) {
        (true, _) => println!("{}", body.trim()),
        (false, false) => {
            let table = match args.command {
                AdminCommand::List => activities_table(&body),
                AdminCommand::Show(_) => activity_table(&body),
                AdminCommand::DeadLetters(DeadLetterCommand::List { .. }) => dead_letters_table(&body),
                AdminCommand::DeadLetters(DeadLetterCommand::Replay { .. }) => replay_table(&body),
                _ => None,
            };
            println!("{}", table.unwrap_or_else(|| human(&body)))
        }
        (false, true) => eprintln!("error: {called}: {status} {}", refusal(&body)),
    }
    if refused || violated {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_must_be_plain_http_to_a_host_and_port() {
        assert_eq!(listener("http://127.0.0.1:9090/").unwrap(), "127.0.0.1:9090");
        assert_eq!(
            listener("http://admin.staging:9090").unwrap(),
            "admin.staging:9090"
        );
        assert!(listener("https://127.0.0.1:9090")
            .unwrap_err()
            .contains("plain HTTP"));
        assert!(listener("http://127.0.0.1").unwrap_err().contains("HOST:PORT"));
        assert!(listener("http://127.0.0.1:9090/api")
            .unwrap_err()
            .contains("HOST:PORT"));
    }

    /// Every operator route of the admin listener is a subcommand's call (the probes and the
    /// scrape are not the operator's).
    #[test]
    fn every_admin_route_is_a_subcommand() {
        let a = || Activity { activity: 42 };
        let dl = AdminCommand::DeadLetters;
        let spec = std::env::temp_dir().join(format!("seckill-admin-spec-{}.json", std::process::id()));
        std::fs::write(&spec, "{}").unwrap();
        let commands = vec![
            AdminCommand::Create { file: spec.clone() },
            AdminCommand::List,
            AdminCommand::Show(a()),
            AdminCommand::Warmup(a()),
            AdminCommand::Pause(a()),
            AdminCommand::Resume(a()),
            AdminCommand::Close(a()),
            AdminCommand::Reconcile(a()),
            AdminCommand::Audit(a()),
            AdminCommand::Order {
                activity: 42,
                user: 7,
            },
            AdminCommand::Cancel {
                reservation: "0123456789abcdef0123456789abcdef".into(),
            },
            dl(DeadLetterCommand::List { limit: 10 }),
            dl(DeadLetterCommand::Show { at: (0, 3) }),
            dl(DeadLetterCommand::Replay { at: None, all: true }),
        ];
        let mut calls: Vec<(String, String)> = commands
            .iter()
            .map(|c| call_of(c).unwrap())
            .map(|(m, path, _)| (m.to_lowercase(), path.split('?').next().unwrap().to_string()))
            .collect();
        calls.push(("post".into(), PURGE.into()));
        let _ = std::fs::remove_file(&spec);
        let matches = |template: &str, path: &str| {
            let (t, p): (Vec<_>, Vec<_>) = (template.split('/').collect(), path.split('/').collect());
            t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| t.starts_with('{') || t == p)
        };
        for (method, route) in seckill_api::ADMIN_ROUTES {
            if ["/metrics", "/healthz", "/readyz"].contains(route) {
                continue;
            }
            assert!(
                calls.iter().any(|(m, p)| m == method && matches(route, p)),
                "{method} {route}: no subcommand calls it ({calls:?})"
            );
        }
    }

    #[test]
    fn a_cancel_needs_a_reservation_id() {
        let cancel = |r: &str| {
            call_of(&AdminCommand::Cancel {
                reservation: r.into(),
            })
        };
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(cancel(id).unwrap().1, format!("/api/v1/admin/orders/{id}/cancel"));
        assert!(cancel("42").unwrap_err().contains("32 lowercase hex digits"));
        assert!(cancel(&id.replace('0', "/")).is_err());
    }

    #[test]
    fn an_object_answer_reads_as_lines() {
        assert_eq!(
            human(r#"{"verdict":"ok","units_sold":3}"#),
            "units_sold: 3\nverdict: ok"
        );
        assert_eq!(human("not json\n"), "not json");
        let e = r#"{"error":{"code":"forbidden","field":"authorization","message":"wrong admin token"}}"#;
        assert_eq!(refusal(e), "forbidden: authorization: wrong admin token");
    }
}
