//! `seckill plan`: capacity planning by the seeds' method (articles 000 and 002). Traffic enters
//! a funnel of layers; each layer handles the QPS that reaches it, needs
//! `⌈ qps × safety / per-node capacity ⌉` nodes, holds `qps × response time` requests at once
//! (Little's law) and passes a share of them on (rate limits) or at most the stock (Redis).
//! Then the short-stave check: the layer with the least headroom, and the database connections
//! the application layer would open against the database's limit.
//!
//! Pure arithmetic; the presets reproduce the two worked tables of the seeds (unit-tested).

use serde::Serialize;

/// One layer of the funnel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layer {
    pub name: String,
    /// Measured capacity of one node, requests per second; `None`: not sized here.
    pub per_node_qps: Option<u64>,
    /// Response time in this layer, ms (for concurrency by Little's law).
    pub latency_ms: f64,
    /// Response size per request, bytes (for bandwidth); 0 when not counted.
    pub response_bytes: u64,
    /// What the layer lets through.
    pub pass: Pass,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Pass {
    /// This fraction of what reaches the layer goes on (a rate limit, a captcha).
    Ratio(f64),
    /// At most the stock succeeds (the Redis pre-deduct): everything after sees at most this.
    Stock(u64),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scenario {
    pub name: String,
    pub entry_qps: u64,
    /// Nodes are sized for `qps × safety` (2.0 = run at 50% of measured capacity).
    pub safety: f64,
    pub layers: Vec<Layer>,
    /// Connections each application node opens to the database, and the database's limit.
    pub db_pool_per_app_node: Option<u32>,
    pub db_max_connections: Option<u32>,
    /// The layer whose nodes open database connections.
    pub app_layer: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerPlan {
    pub name: String,
    pub qps_in: u64,
    pub qps_out: u64,
    pub nodes: Option<u64>,
    /// Requests in flight at once (Little's law: qps × response time).
    pub concurrency: f64,
    pub bandwidth_gbps: f64,
    /// Capacity of the sized nodes over the load (1.0 = exactly full).
    pub headroom: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanReport {
    pub scenario: String,
    pub layers: Vec<LayerPlan>,
    /// The layer with the least headroom: the short stave.
    pub weakest: Option<String>,
    /// (connections the application nodes would open, the database's limit).
    pub db_connections: Option<(u64, u32)>,
    pub warnings: Vec<String>,
}

impl Scenario {
    pub fn plan(&self) -> PlanReport {
        let mut qps = self.entry_qps;
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let qps_out = match l.pass {
                Pass::Ratio(r) => (qps as f64 * r).round() as u64,
                Pass::Stock(s) => qps.min(s),
            };
            // ⌈qps × safety / per-node⌉ in integer arithmetic (safety in thousandths), so that
            // 100000 × 2 / 80000 is 3 and 100000 × 1.5 / 25000 is exactly 6.
            let nodes = l.per_node_qps.map(|cap| {
                let need = qps as u128 * (self.safety * 1_000.0).round() as u128;
                let per = cap as u128 * 1_000;
                need.div_ceil(per).max(1) as u64
            });
            layers.push(LayerPlan {
                name: l.name.clone(),
                qps_in: qps,
                qps_out,
                nodes,
                concurrency: qps as f64 * l.latency_ms / 1_000.0,
                bandwidth_gbps: qps as f64 * l.response_bytes as f64 * 8.0 / 1e9,
                headroom: nodes
                    .zip(l.per_node_qps)
                    .map(|(n, cap)| (n * cap) as f64 / qps.max(1) as f64),
            });
            qps = qps_out;
        }
        let weakest = layers
            .iter()
            .filter_map(|l| l.headroom.map(|h| (h, &l.name)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, n)| n.clone());
        let mut warnings = Vec::new();
        let db_connections = match (
            &self.app_layer,
            self.db_pool_per_app_node,
            self.db_max_connections,
        ) {
            (Some(app), Some(pool), Some(max)) => layers
                .iter()
                .find(|l| &l.name == app)
                .and_then(|l| l.nodes)
                .map(|n| {
                    let total = n * pool as u64;
                    if total > max as u64 {
                        warnings.push(format!(
                        "{n} {app} nodes × {pool} database connections = {total} > max_connections {max}: \
                         size the pools to the consumers, not to the app nodes"
                    ));
                    }
                    (total, max)
                }),
            _ => None,
        };
        PlanReport {
            scenario: self.name.clone(),
            layers,
            weakest,
            db_connections,
            warnings,
        }
    }
}

/// Per-node capacities measured by `seckill bench` on this machine (ops/s of one process).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    /// The engine's purchase path (reserve + publish) in one process: the application layer.
    pub app: Option<u64>,
    /// Reserve scripts over 32 buckets on one Redis: a Redis node.
    pub redis: Option<u64>,
    /// Orders applied by the batched consumer on one MariaDB: the database.
    pub db: Option<u64>,
}

/// The bench rows that stand for each layer (`seckill bench --json` names).
pub const BENCH_APP: &str = "engine: PurchaseService reserve path";
pub const BENCH_REDIS: &str = "redis: Lua, 32 buckets";
pub const BENCH_DB: &str = "engine: consumer Kafka -> MariaDB, batched";

/// Read `seckill bench --json` output: `{"rows": [{"name", "ops_per_sec", ...}]}`.
pub fn capacities_from_bench(text: &str) -> Result<Measured, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let rows = v["rows"]
        .as_array()
        .ok_or("no \"rows\" array: not `seckill bench --json` output")?;
    let find = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .and_then(|r| r["ops_per_sec"].as_f64())
            .map(|x| x.floor() as u64)
    };
    let m = Measured {
        app: find(BENCH_APP),
        redis: find(BENCH_REDIS),
        db: find(BENCH_DB),
    };
    if m == Measured::default() {
        return Err(format!(
            "none of the rows {BENCH_APP:?}, {BENCH_REDIS:?}, {BENCH_DB:?}"
        ));
    }
    Ok(m)
}

/// Replace the preset's per-node guesses with what was measured (layers matched by their role).
pub fn apply_measured(s: &mut Scenario, m: &Measured) {
    for l in &mut s.layers {
        let name = l.name.to_ascii_lowercase();
        let measured = if name.starts_with("redis") {
            m.redis
        } else if name.starts_with("mysql") {
            m.db
        } else if name.starts_with("application") || name.starts_with("seckill service") {
            m.app
        } else {
            None
        };
        if let (Some(cap), Some(_)) = (measured, l.per_node_qps) {
            l.per_node_qps = Some(cap.max(1));
        }
    }
}

fn layer(name: &str, per_node_qps: Option<u64>, latency_ms: f64, response_bytes: u64, pass: Pass) -> Layer {
    Layer {
        name: name.into(),
        per_node_qps,
        latency_ms,
        response_bytes,
        pass,
    }
}

/// Article 000's funnel: 100 units, 500k QPS at the door; Nginx at 50k/node, the application at
/// 5k/node, Redis at 80k/node, MySQL at 3k/node, all run at 50% (safety 2) → 20 access nodes,
/// 40 application nodes, 3 Redis, 1 MySQL; 40 × 20 pooled connections against MySQL's default 151.
pub fn seed_funnel_500k() -> Scenario {
    Scenario {
        name: "seed-funnel-500k".into(),
        entry_qps: 500_000,
        safety: 2.0,
        layers: vec![
            // Nginx limit_req by IP lets 200k of 500k through; the application's token bucket
            // then lets 100k through before any business logic runs.
            layer("access (LVS + Nginx)", Some(50_000), 1.0, 0, Pass::Ratio(0.4)),
            layer("token bucket", None, 0.0, 0, Pass::Ratio(0.5)),
            layer("application", Some(5_000), 20.0, 0, Pass::Ratio(1.0)),
            layer("redis", Some(80_000), 0.5, 0, Pass::Stock(100)),
            layer("mq", None, 5.0, 0, Pass::Ratio(1.0)),
            layer("mysql", Some(3_000), 5.0, 0, Pass::Ratio(1.0)),
        ],
        db_pool_per_app_node: Some(20),
        db_max_connections: Some(151),
        app_layer: Some("application".into()),
    }
}

/// Article 002's funnel: 100k QPS at the door, 1,000 units; gateways at 25k/node (TLS and
/// limits), the seckill service at 3k/node (memory checks + one Redis call), ×1.5 headroom →
/// 6 gateways, 10 service nodes; 2k concurrent at the gateways (100k × 20 ms), 1k in the service
/// (20k × 50 ms), 10 in Redis (20k × 0.5 ms), 5 in the DB (1k × 5 ms); 3.2 Gbps in, 0.64 Gbps
/// after the funnel (4 KB answers); one MySQL primary for the 1,000 TPS the stock allows.
pub fn seed_100k() -> Scenario {
    Scenario {
        name: "seed-100k".into(),
        entry_qps: 100_000,
        safety: 1.5,
        layers: vec![
            // Captcha / quiz (50%) and the gateway's token bucket leave 20k of 100k.
            layer("gateway", Some(25_000), 20.0, 4_000, Pass::Ratio(0.2)),
            layer("seckill service", Some(3_000), 50.0, 4_000, Pass::Ratio(1.0)),
            layer("redis (32 buckets)", Some(50_000), 0.5, 0, Pass::Stock(1_000)),
            layer("kafka (6 partitions)", None, 2.0, 0, Pass::Ratio(1.0)),
            // Article 000's single-machine write rate (3k–8k/s, low end); article 002's 1k TPS is
            // one hot row's limit, which the buckets and the batching consumer avoid.
            layer("mysql primary", Some(3_000), 5.0, 0, Pass::Ratio(1.0)),
        ],
        db_pool_per_app_node: None,
        db_max_connections: None,
        app_layer: None,
    }
}

pub fn preset(name: &str) -> Option<Scenario> {
    match name {
        "seed-funnel-500k" => Some(seed_funnel_500k()),
        "seed-100k" => Some(seed_100k()),
        _ => None,
    }
}

pub const PRESETS: [&str; 2] = ["seed-funnel-500k", "seed-100k"];

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(r: &PlanReport, name: &str) -> Option<u64> {
        r.layers.iter().find(|l| l.name == name).unwrap().nodes
    }

    #[test]
    fn the_500k_funnel_of_article_000() {
        let r = seed_funnel_500k().plan();
        assert_eq!(nodes(&r, "access (LVS + Nginx)"), Some(20));
        assert_eq!(nodes(&r, "application"), Some(40));
        assert_eq!(nodes(&r, "redis"), Some(3));
        assert_eq!(nodes(&r, "mysql"), Some(1));
        let flow: Vec<u64> = r.layers.iter().map(|l| l.qps_in).collect();
        assert_eq!(flow, vec![500_000, 200_000, 100_000, 100_000, 100, 100]);
        assert_eq!(r.db_connections, Some((800, 151)));
        assert_eq!(r.warnings.len(), 1, "40 × 20 connections exceed max_connections");
        // 3 Redis nodes at 80k carry 240k for 100k: the access layer (1.0×2) is tighter.
        assert_eq!(r.weakest.as_deref(), Some("access (LVS + Nginx)"));
    }

    #[test]
    fn measured_capacities_replace_the_guesses() {
        let bench = format!(
            r#"{{"rows": [{{"name": "{BENCH_REDIS}", "ops_per_sec": 160000.7}}, {{"name": "{BENCH_APP}", "ops_per_sec": 10000}}]}}"#
        );
        let m = capacities_from_bench(&bench).unwrap();
        assert_eq!((m.redis, m.app, m.db), (Some(160_000), Some(10_000), None));
        let mut s = seed_funnel_500k();
        apply_measured(&mut s, &m);
        let r = s.plan();
        assert_eq!(nodes(&r, "application"), Some(20));
        assert_eq!(nodes(&r, "redis"), Some(2));
        assert_eq!(
            nodes(&r, "mysql"),
            Some(1),
            "not measured: the preset's figure stays"
        );
        assert!(capacities_from_bench("{}").is_err());
        assert!(capacities_from_bench(r#"{"rows": []}"#).is_err());
    }

    #[test]
    fn the_100k_funnel_of_article_002() {
        let r = seed_100k().plan();
        assert_eq!(nodes(&r, "gateway"), Some(6));
        assert_eq!(nodes(&r, "seckill service"), Some(10));
        let conc: Vec<f64> = r.layers.iter().map(|l| l.concurrency).collect();
        assert_eq!(conc[0], 2_000.0);
        assert_eq!(conc[1], 1_000.0);
        assert_eq!(conc[2], 10.0);
        assert_eq!(conc[4], 5.0);
        let mysql = r.layers.iter().find(|l| l.name == "mysql primary").unwrap();
        assert_eq!(
            (mysql.qps_in, mysql.nodes),
            (1_000, Some(1)),
            "one MySQL primary for 1,000 TPS"
        );
        assert!(
            (r.layers[0].bandwidth_gbps - 3.2).abs() < 1e-9,
            "{}",
            r.layers[0].bandwidth_gbps
        );
        assert!((r.layers[1].bandwidth_gbps - 0.64).abs() < 1e-9);
        // Per Redis bucket: 20k over 32 buckets.
        assert_eq!(r.layers[2].qps_in / 32, 625);
    }
}
