//! An in-memory model of the part of Redis that seckill uses: a keyspace of strings, sets and
//! hashes, the data commands our scripts call, and Lua 5.1 scripting with Redis's semantics —
//! `redis.call`/`redis.pcall`, the Lua⇄RESP conversions, error replies, EVAL/EVALSHA/SCRIPT LOAD
//! with NOSCRIPT, and Redis's sandbox (no `os`/`io`, no new globals, and a `math.random` that is
//! reseeded before every script so a script is a pure function of the keyspace and its args).
//!
//! The same `lua/` files run here and on real Redis; issue-level differential tests compare the
//! two. Used by the embedded backend and by the simulated Redis node.
//!
//! One `std::sync::Mutex` guards the Lua state and the keyspace together: a script runs to
//! completion while it is held, which is exactly Redis's atomicity (one thread, no interleaving),
//! and nothing awaits while it is held.

use crate::adapters::script::{sha1_hex, Reply};
use bstr::BStr;
use mlua::{Function, Lua, LuaOptions, StdLib, Table, Value as LuaValue};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::sync::Mutex;

/// A stored value. Empty sets and hashes are never stored: like Redis, removing the last
/// member removes the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Str(Vec<u8>),
    Set(BTreeSet<Vec<u8>>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
}

pub type Keyspace = BTreeMap<Vec<u8>, Value>;

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

pub struct RedisModel {
    state: Mutex<ModelState>,
}

struct ModelState {
    lua: Lua,
    /// Compiled scripts by SHA1 (what `SCRIPT LOAD` / `EVAL` registered).
    scripts: BTreeMap<String, Function>,
    /// Runs a script: sets KEYS and ARGV, resets the sandbox's `math.random`, calls it under
    /// `pcall` — one crossing into Lua per script.
    runner: Function,
    /// Incarnations so far: `INFO server` `run_id` changes on every restart, and so does ours.
    restarts: u64,
}

impl Default for RedisModel {
    fn default() -> Self {
        Self::new()
    }
}

/// Lua side of the sandbox, run once per state: `redis.call` on top of the Rust `redis.pcall`,
/// the reply helpers, a deterministic `math.random` (Park–Miller; products stay below 2^53 so
/// doubles are exact) and, last, a `_G` that refuses new or unknown globals like Redis does.
const SANDBOX: &str = r#"
local pcall_impl = redis.pcall
redis.call = function(...)
  local reply = pcall_impl(...)
  if type(reply) == "table" and reply.err then error(reply, 0) end
  return reply
end
redis.error_reply = function(msg) return { err = msg } end
redis.status_reply = function(msg) return { ok = msg } end
redis.log = function() end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
local state = 1
local floor = math.floor
math.randomseed = function(seed)
  state = floor(tonumber(seed) or 0) % 2147483647
  if state == 0 then state = 1 end
end
math.random = function(m, n)
  state = (state * 16807) % 2147483647
  local r = (state - 1) / 2147483646
  if m == nil then return r end
  if n == nil then return floor(r * m) + 1 end
  return floor(r * (n - m + 1)) + m
end
loadfile, dofile, print = nil, nil, nil
setmetatable(_G, {
  __newindex = function(_, name) error("Script attempted to create global variable '" .. tostring(name) .. "'", 2) end,
  __index = function(_, name) error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2) end,
})
-- One call per script from Rust: KEYS and ARGV from the arguments, the random state reset,
-- then the script under pcall (captured here, before user code can see the globals).
local pcall, rawset = pcall, rawset
return function(f, nkeys, ...)
  local keys, argv, all = {}, {}, {...}
  for i = 1, nkeys do keys[i] = all[i] end
  for i = nkeys + 1, #all do argv[i - nkeys] = all[i] end
  rawset(_G, "KEYS", keys)
  rawset(_G, "ARGV", argv)
  state = 1
  return pcall(f)
end
"#;

impl RedisModel {
    pub fn new() -> RedisModel {
        let (lua, runner) = new_lua().expect("the fixed sandbox always loads");
        RedisModel {
            state: Mutex::new(ModelState {
                lua,
                scripts: BTreeMap::new(),
                runner,
                restarts: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ModelState> {
        // A panic inside a script call cannot leave the keyspace half-written by Rust code (each
        // command applies in one step), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run one command, exactly as a client would send it.
    pub fn command(&self, argv: &[Vec<u8>]) -> Reply {
        let Some(name) = argv.first() else {
            return Reply::Error("ERR empty command".into());
        };
        let name = String::from_utf8_lossy(name).to_ascii_uppercase();
        let mut st = self.lock();
        match name.as_str() {
            "EVAL" | "EVALSHA" => {
                let Some(target) = argv.get(1) else {
                    return arity(&name);
                };
                let Some((keys, args)) = split_numkeys(&argv[2..]) else {
                    return Reply::Error("ERR Number of keys can't be greater than number of args".into());
                };
                let sha = if name == "EVAL" {
                    match st.load(&String::from_utf8_lossy(target)) {
                        Ok(sha) => sha,
                        Err(e) => return e,
                    }
                } else {
                    String::from_utf8_lossy(target).to_ascii_lowercase()
                };
                st.eval(&sha, &slices(&keys), &slices(&args))
            }
            "SCRIPT" => match argv
                .get(1)
                .map(|s| String::from_utf8_lossy(s).to_ascii_uppercase())
            {
                Some(sub) if sub == "LOAD" && argv.len() == 3 => {
                    match st.load(&String::from_utf8_lossy(&argv[2])) {
                        Ok(sha) => Reply::Bulk(sha.into_bytes()),
                        Err(e) => e,
                    }
                }
                Some(sub) if sub == "EXISTS" => Reply::Array(
                    argv[2..]
                        .iter()
                        .map(|s| Reply::Int(st.scripts.contains_key(&*String::from_utf8_lossy(s)) as i64))
                        .collect(),
                ),
                Some(sub) if sub == "FLUSH" => {
                    st.scripts.clear();
                    Reply::Status("OK".into())
                }
                _ => Reply::Error("ERR unknown SCRIPT subcommand".into()),
            },
            _ => {
                let mut ks = st
                    .lua
                    .app_data_mut::<Keyspace>()
                    .expect("keyspace installed at creation");
                exec(&mut ks, argv)
            }
        }
    }

    pub fn eval_sha(&self, sha: &str, keys: &[String], args: &[String]) -> Reply {
        self.lock().eval(sha, &slices(keys), &slices(args))
    }

    pub fn script_load(&self, source: &str) -> Reply {
        match self.lock().load(source) {
            Ok(sha) => Reply::Bulk(sha.into_bytes()),
            Err(e) => e,
        }
    }

    /// Read the keyspace in place, under the lock, without a script or a copy (the simulation's
    /// checker reads Redis raw, many times a simulated second).
    pub fn read<T>(&self, f: impl FnOnce(&Keyspace) -> T) -> T {
        let st = self.lock();
        let ks = st
            .lua
            .app_data_ref::<Keyspace>()
            .expect("keyspace installed at creation");
        let out = f(ks.deref());
        drop(ks);
        out
    }

    /// A copy of the whole keyspace (for audits of the model and differential tests).
    pub fn dump(&self) -> Keyspace {
        self.read(Keyspace::clone)
    }

    /// The server's run id (Redis: `INFO server` → `run_id`): new after every restart.
    pub fn run_id(&self) -> String {
        format!("{:040x}", self.lock().restarts)
    }

    /// A restart that reloads `keyspace` (an AOF/RDB image): data as saved, script cache empty.
    pub fn restore(&self, keyspace: Keyspace) {
        let mut st = self.lock();
        st.restarts += 1;
        st.scripts.clear();
        *st.lua
            .app_data_mut::<Keyspace>()
            .expect("keyspace installed at creation") = keyspace;
    }

    /// A restart without persistence: data and script cache are gone.
    pub fn flush_all(&self) {
        let mut st = self.lock();
        st.restarts += 1;
        st.scripts.clear();
        st.lua
            .app_data_mut::<Keyspace>()
            .expect("keyspace installed at creation")
            .clear();
    }
}

fn new_lua() -> mlua::Result<(Lua, Function)> {
    // Redis loads base, table, string, math (plus cjson/struct/bit, which our scripts avoid);
    // never os, io, package or debug.
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH,
        LuaOptions::default(),
    )?;
    lua.set_app_data(Keyspace::new());
    lua.set_app_data(ServerClock(tokio::time::Instant::now()));
    let redis = lua.create_table()?;
    redis.set("pcall", lua.create_function(redis_pcall)?)?;
    redis.set(
        "sha1hex",
        lua.create_function(|_, s: mlua::LuaString| Ok(sha1_hex(&s.to_string_lossy())))?,
    )?;
    lua.globals().set("redis", redis)?;
    let runner: Function = lua.load(SANDBOX).set_name("=sandbox").call(())?;
    Ok((lua, runner))
}

impl ModelState {
    fn load(&mut self, source: &str) -> Result<String, Reply> {
        let sha = sha1_hex(source);
        if !self.scripts.contains_key(&sha) {
            let f = self
                .lua
                .load(source)
                .set_name("@user_script")
                .into_function()
                .map_err(|e| Reply::Error(format!("ERR Error compiling script (new function): {e}")))?;
            self.scripts.insert(sha.clone(), f);
        }
        Ok(sha)
    }

    fn eval(&mut self, sha: &str, keys: &[&[u8]], args: &[&[u8]]) -> Reply {
        let Some(f) = self.scripts.get(sha) else {
            return Reply::Error("NOSCRIPT No matching script. Please use EVAL.".into());
        };
        match self.run(f, keys, args) {
            Ok(reply) => reply,
            Err(e) => Reply::Error(format!("ERR {e}")),
        }
    }

    fn run(&self, f: &Function, keys: &[&[u8]], args: &[&[u8]]) -> mlua::Result<Reply> {
        let strings = keys.iter().chain(args).map(BStr::new);
        let (ok, value): (bool, LuaValue) =
            self.runner
                .call((f, keys.len(), mlua::Variadic::from_iter(strings)))?;
        if ok {
            return Ok(lua_to_reply(&value));
        }
        // A raised `{err = ...}` (from redis.call) is the error reply itself; anything else is a
        // runtime error of the script.
        Ok(match &value {
            LuaValue::Table(t) => match t.raw_get::<LuaValue>("err")? {
                LuaValue::String(e) => Reply::Error(e.to_string_lossy()),
                _ => Reply::Error("ERR script raised a table without err".into()),
            },
            LuaValue::String(s) => Reply::Error(format!("ERR user_script: {}", s.to_string_lossy())),
            LuaValue::Error(e) => Reply::Error(format!("ERR user_script: {e}")),
            other => Reply::Error(format!("ERR user_script: {other:?}")),
        })
    }
}

/// The model's `TIME`: a fixed wall origin advanced by `tokio::time` from the model's creation —
/// the simulated clock under madsim, so a seed replays the same times. It keeps running across
/// the model's restarts (`flush_all`, `restore`), as a server's wall clock does.
struct ServerClock(tokio::time::Instant);

/// 2026-01-01T00:00:00Z: where the model's `TIME` starts.
const SERVER_CLOCK_ORIGIN_MS: u64 = 1_767_225_600_000;

impl ServerClock {
    fn reply(&self) -> Reply {
        let us = SERVER_CLOCK_ORIGIN_MS * 1000 + self.0.elapsed().as_micros() as u64;
        Reply::Array(vec![
            Reply::Bulk((us / 1_000_000).to_string().into_bytes()),
            Reply::Bulk((us % 1_000_000).to_string().into_bytes()),
        ])
    }
}

/// `redis.pcall(cmd, ...)`: run a data command; errors come back as `{err = msg}`. Arguments
/// must be strings or numbers (numbers are formatted the way Lua's `tostring` does).
fn redis_pcall(lua: &Lua, args: mlua::Variadic<LuaValue>) -> mlua::Result<LuaValue> {
    if args.is_empty() {
        return Err(mlua::Error::runtime(
            "Please specify at least one argument for this redis lib call",
        ));
    }
    let mut argv = Vec::with_capacity(args.len());
    for a in args.iter() {
        match a {
            LuaValue::String(s) => argv.push(s.as_bytes().to_vec()),
            LuaValue::Integer(_) | LuaValue::Number(_) => {
                let s: mlua::LuaString = lua.coerce_string(a.clone())?.expect("numbers coerce to strings");
                argv.push(s.as_bytes().to_vec());
            }
            _ => {
                return Err(mlua::Error::runtime(
                    "Lua redis lib command arguments must be strings or integers",
                ))
            }
        }
    }
    let reply = if argv.len() == 1 && argv[0].eq_ignore_ascii_case(b"TIME") {
        lua.app_data_ref::<ServerClock>()
            .expect("clock installed at creation")
            .reply()
    } else {
        let mut ks = lua
            .app_data_mut::<Keyspace>()
            .expect("keyspace installed at creation");
        exec(&mut ks, &argv)
    };
    reply_to_lua(lua, reply)
}

/// Lua value → RESP, by Redis's rules: numbers truncate to integers, `true` is 1, `false` is
/// nil, a table with `err`/`ok` is an error/status, any other table is an array up to its
/// first nil.
fn lua_to_reply(v: &LuaValue) -> Reply {
    match v {
        LuaValue::Boolean(true) => Reply::Int(1),
        LuaValue::Integer(i) => Reply::Int(*i),
        LuaValue::Number(n) => Reply::Int(*n as i64),
        LuaValue::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        LuaValue::Table(t) => table_to_reply(t),
        _ => Reply::Nil,
    }
}

fn table_to_reply(t: &Table) -> Reply {
    if let Ok(LuaValue::String(e)) = t.raw_get::<LuaValue>("err") {
        return Reply::Error(e.to_string_lossy());
    }
    if let Ok(LuaValue::String(s)) = t.raw_get::<LuaValue>("ok") {
        return Reply::Status(s.to_string_lossy());
    }
    let mut items = Vec::new();
    for i in 1.. {
        match t.raw_get::<LuaValue>(i) {
            Ok(LuaValue::Nil) | Err(_) => break,
            Ok(v) => items.push(lua_to_reply(&v)),
        }
    }
    Reply::Array(items)
}

/// RESP → Lua value, by Redis's rules: nil is `false`, status is `{ok=...}`, error `{err=...}`.
fn reply_to_lua(lua: &Lua, r: Reply) -> mlua::Result<LuaValue> {
    Ok(match r {
        Reply::Nil => LuaValue::Boolean(false),
        Reply::Int(i) => LuaValue::Integer(i),
        Reply::Bulk(b) => LuaValue::String(lua.create_string(b)?),
        Reply::Status(s) => LuaValue::Table(lua.create_table_from([("ok", s)])?),
        Reply::Error(e) => LuaValue::Table(lua.create_table_from([("err", e)])?),
        Reply::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, reply_to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
    })
}

fn slices<T: AsRef<[u8]>>(v: &[T]) -> Vec<&[u8]> {
    v.iter().map(AsRef::as_ref).collect()
}

fn arity(name: &str) -> Reply {
    Reply::Error(format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// Command arguments as raw byte strings.
type Args = Vec<Vec<u8>>;

fn split_numkeys(rest: &[Vec<u8>]) -> Option<(Args, Args)> {
    let n: usize = std::str::from_utf8(rest.first()?).ok()?.parse().ok()?;
    let rest = &rest[1..];
    (n <= rest.len()).then(|| (rest[..n].to_vec(), rest[n..].to_vec()))
}

/// Redis's integer parsing (`string2ll`): optional '-', digits, no '+', spaces or leading zeros.
fn parse_int(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) || s == "-0" {
        return None;
    }
    if !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Execute one data command against the keyspace.
pub fn exec(ks: &mut Keyspace, argv: &[Vec<u8>]) -> Reply {
    // The name upper-cased on the stack: every command a script sends passes here.
    let mut upper = [0u8; 16];
    let raw = &argv[0];
    let name = match upper.get_mut(..raw.len()) {
        Some(buf) => {
            buf.copy_from_slice(raw);
            buf.make_ascii_uppercase();
            std::str::from_utf8(buf).unwrap_or("")
        }
        None => "",
    };
    let args = &argv[1..];
    let need = |ok: bool| if ok { None } else { Some(arity(name)) };
    let check = match name {
        "GET" | "SMEMBERS" | "SCARD" | "HGETALL" | "HLEN" | "TYPE" => need(args.len() == 1),
        "INCR" | "DECR" => need(args.len() == 1),
        "SET" => need(args.len() == 2 || args.len() == 3),
        "INCRBY" | "DECRBY" | "SISMEMBER" | "HGET" | "HEXISTS" => need(args.len() == 2),
        "HINCRBY" => need(args.len() == 3),
        "DEL" | "EXISTS" => need(!args.is_empty()),
        "SADD" | "SREM" | "HDEL" | "HMGET" => need(args.len() >= 2),
        "HSET" => need(args.len() >= 3 && args.len() % 2 == 1),
        "FLUSHALL" | "DBSIZE" => need(args.is_empty()),
        _ => {
            return Reply::Error(format!(
                "ERR unknown command '{}'",
                String::from_utf8_lossy(raw).to_ascii_lowercase()
            ))
        }
    };
    if let Some(err) = check {
        return err;
    }
    match name {
        "GET" => match ks.get(&args[0]) {
            None => Reply::Nil,
            Some(Value::Str(v)) => Reply::Bulk(v.clone()),
            Some(_) => Reply::Error(WRONGTYPE.into()),
        },
        "SET" => {
            if let Some(opt) = args.get(2) {
                if !opt.eq_ignore_ascii_case(b"NX") {
                    return Reply::Error("ERR syntax error".into());
                }
                if ks.contains_key(&args[0]) {
                    return Reply::Nil;
                }
            }
            ks.insert(args[0].clone(), Value::Str(args[1].clone()));
            Reply::Status("OK".into())
        }
        "INCR" | "DECR" | "INCRBY" | "DECRBY" => {
            let by = match name {
                "INCR" => Some(1),
                "DECR" => Some(-1),
                "INCRBY" => parse_int(&args[1]),
                _ => parse_int(&args[1]).and_then(i64::checked_neg),
            };
            let Some(by) = by else {
                return Reply::Error(NOT_INTEGER.into());
            };
            let current = match ks.get(&args[0]) {
                None => 0,
                Some(Value::Str(v)) => match parse_int(v) {
                    Some(n) => n,
                    None => return Reply::Error(NOT_INTEGER.into()),
                },
                Some(_) => return Reply::Error(WRONGTYPE.into()),
            };
            let Some(next) = current.checked_add(by) else {
                return Reply::Error("ERR increment or decrement would overflow".into());
            };
            ks.insert(args[0].clone(), Value::Str(next.to_string().into_bytes()));
            Reply::Int(next)
        }
        "DEL" => Reply::Int(args.iter().filter(|k| ks.remove(*k).is_some()).count() as i64),
        "EXISTS" => Reply::Int(args.iter().filter(|k| ks.contains_key(*k)).count() as i64),
        "TYPE" => Reply::Status(
            match ks.get(&args[0]) {
                None => "none",
                Some(Value::Str(_)) => "string",
                Some(Value::Set(_)) => "set",
                Some(Value::Hash(_)) => "hash",
            }
            .into(),
        ),
        "FLUSHALL" => {
            ks.clear();
            Reply::Status("OK".into())
        }
        "DBSIZE" => Reply::Int(ks.len() as i64),
        "SADD" | "SREM" | "SISMEMBER" | "SMEMBERS" | "SCARD" => set_command(ks, name, args),
        _ => hash_command(ks, name, args),
    }
}

fn set_command(ks: &mut Keyspace, name: &str, args: &[Vec<u8>]) -> Reply {
    let key = &args[0];
    let set = match ks.get_mut(key) {
        Some(Value::Set(s)) => Some(s),
        Some(_) => return Reply::Error(WRONGTYPE.into()),
        None => None,
    };
    let reply = match (name, set) {
        ("SADD", Some(s)) => Reply::Int(args[1..].iter().filter(|m| s.insert(m.to_vec())).count() as i64),
        ("SADD", None) => {
            let s: BTreeSet<Vec<u8>> = args[1..].iter().cloned().collect();
            let n = s.len();
            ks.insert(key.clone(), Value::Set(s));
            return Reply::Int(n as i64);
        }
        ("SREM", Some(s)) => Reply::Int(args[1..].iter().filter(|m| s.remove(*m)).count() as i64),
        ("SISMEMBER", Some(s)) => Reply::Int(s.contains(&args[1]) as i64),
        ("SMEMBERS", Some(s)) => Reply::Array(s.iter().map(|m| Reply::Bulk(m.clone())).collect()),
        ("SCARD", Some(s)) => Reply::Int(s.len() as i64),
        ("SMEMBERS", None) => Reply::Array(vec![]),
        (_, None) => Reply::Int(0),
        _ => unreachable!("set_command is only called for set commands"),
    };
    if matches!(ks.get(key), Some(Value::Set(s)) if s.is_empty()) {
        ks.remove(key);
    }
    reply
}

fn hash_command(ks: &mut Keyspace, name: &str, args: &[Vec<u8>]) -> Reply {
    let key = &args[0];
    let hash = match ks.get_mut(key) {
        Some(Value::Hash(h)) => Some(h),
        Some(_) => return Reply::Error(WRONGTYPE.into()),
        None => None,
    };
    let reply = match (name, hash) {
        ("HSET", h) => {
            let mut fresh = BTreeMap::new();
            let h = match h {
                Some(h) => h,
                None => &mut fresh,
            };
            let added = args[1..]
                .chunks(2)
                .filter(|fv| h.insert(fv[0].clone(), fv[1].clone()).is_none())
                .count();
            if !fresh.is_empty() {
                ks.insert(key.clone(), Value::Hash(fresh));
            }
            return Reply::Int(added as i64);
        }
        ("HINCRBY", h) => {
            let Some(by) = parse_int(&args[2]) else {
                return Reply::Error(NOT_INTEGER.into());
            };
            let current = match h.as_ref().and_then(|h| h.get(&args[1])) {
                None => 0,
                Some(v) => match parse_int(v) {
                    Some(n) => n,
                    None => return Reply::Error("ERR hash value is not an integer".into()),
                },
            };
            let Some(next) = current.checked_add(by) else {
                return Reply::Error("ERR increment or decrement would overflow".into());
            };
            let value = next.to_string().into_bytes();
            match h {
                Some(h) => {
                    h.insert(args[1].clone(), value);
                }
                None => {
                    ks.insert(
                        key.clone(),
                        Value::Hash(BTreeMap::from([(args[1].clone(), value)])),
                    );
                }
            }
            return Reply::Int(next);
        }
        ("HGET", Some(h)) => h.get(&args[1]).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())),
        ("HMGET", Some(h)) => Reply::Array(
            args[1..]
                .iter()
                .map(|f| h.get(f).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
                .collect(),
        ),
        ("HMGET", None) => Reply::Array(args[1..].iter().map(|_| Reply::Nil).collect()),
        ("HDEL", Some(h)) => Reply::Int(args[1..].iter().filter(|f| h.remove(*f).is_some()).count() as i64),
        ("HEXISTS", Some(h)) => Reply::Int(h.contains_key(&args[1]) as i64),
        ("HLEN", Some(h)) => Reply::Int(h.len() as i64),
        ("HGETALL", Some(h)) => Reply::Array(
            h.iter()
                .flat_map(|(f, v)| [Reply::Bulk(f.clone()), Reply::Bulk(v.clone())])
                .collect(),
        ),
        ("HGET", None) => Reply::Nil,
        ("HGETALL", None) => Reply::Array(vec![]),
        (_, None) => Reply::Int(0),
        _ => unreachable!("hash_command is only called for hash commands"),
    };
    if matches!(ks.get(key), Some(Value::Hash(h)) if h.is_empty()) {
        ks.remove(key);
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(m: &RedisModel, parts: &[&str]) -> Reply {
        m.command(&parts.iter().map(|p| p.as_bytes().to_vec()).collect::<Vec<_>>())
    }

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(s.as_bytes().to_vec())
    }

    #[test]
    fn data_commands_follow_redis() {
        let m = RedisModel::new();
        assert_eq!(cmd(&m, &["GET", "k"]), Reply::Nil);
        assert_eq!(cmd(&m, &["set", "k", "10"]), Reply::Status("OK".into()));
        assert_eq!(cmd(&m, &["DECRBY", "k", "3"]), Reply::Int(7));
        assert_eq!(cmd(&m, &["INCRBY", "k", "+1"]), Reply::Error(NOT_INTEGER.into()));
        assert_eq!(cmd(&m, &["SADD", "k", "x"]), Reply::Error(WRONGTYPE.into()));
        assert_eq!(cmd(&m, &["SADD", "s", "a", "b", "a"]), Reply::Int(2));
        assert_eq!(cmd(&m, &["SREM", "s", "a", "b"]), Reply::Int(2));
        assert_eq!(
            cmd(&m, &["EXISTS", "s"]),
            Reply::Int(0),
            "empty set removes the key"
        );
        assert_eq!(cmd(&m, &["HSET", "h", "f", "1", "g", "2"]), Reply::Int(2));
        assert_eq!(cmd(&m, &["HSET", "h", "f", "3"]), Reply::Int(0));
        assert_eq!(
            cmd(&m, &["HGETALL", "h"]),
            Reply::Array(vec![bulk("f"), bulk("3"), bulk("g"), bulk("2")])
        );
        assert_eq!(cmd(&m, &["HDEL", "h", "f", "g"]), Reply::Int(2));
        assert_eq!(cmd(&m, &["DBSIZE"]), Reply::Int(1));
        assert_eq!(
            cmd(&m, &["GET"]),
            Reply::Error("ERR wrong number of arguments for 'get' command".into())
        );
        assert!(matches!(cmd(&m, &["KEYS", "*"]), Reply::Error(e) if e.starts_with("ERR unknown command")));
    }

    #[test]
    fn scripts_convert_replies_like_redis() {
        let m = RedisModel::new();
        let eval = |src: &str, keys: &[&str], args: &[&str]| {
            let mut v = vec!["EVAL", src];
            let n = keys.len().to_string();
            v.push(&n);
            v.extend_from_slice(keys);
            v.extend_from_slice(args);
            cmd(&m, &v)
        };
        assert_eq!(eval("return 3.9", &[], &[]), Reply::Int(3));
        assert_eq!(eval("return true", &[], &[]), Reply::Int(1));
        assert_eq!(eval("return false", &[], &[]), Reply::Nil);
        assert_eq!(
            eval("return {1, 'a', nil, 2}", &[], &[]),
            Reply::Array(vec![Reply::Int(1), bulk("a")])
        );
        assert_eq!(eval("return {ok='FINE'}", &[], &[]), Reply::Status("FINE".into()));
        assert_eq!(
            eval("return redis.error_reply('ERR nope')", &[], &[]),
            Reply::Error("ERR nope".into())
        );
        assert_eq!(
            eval("return redis.call('GET', KEYS[1])", &["missing"], &[]),
            Reply::Nil
        );
        assert_eq!(
            eval("return {redis.call('GET', KEYS[1])}", &["missing"], &[]),
            Reply::Array(vec![Reply::Nil]),
            "false in an array is nil"
        );
        assert_eq!(
            eval("return redis.call('SET', KEYS[1], ARGV[1])", &["k"], &["v"]),
            Reply::Status("OK".into())
        );
        assert_eq!(
            eval("return redis.call('SET', KEYS[1], 5)", &["n"], &[]),
            Reply::Status("OK".into())
        );
        assert_eq!(cmd(&m, &["GET", "n"]), bulk("5"));
        // redis.call raises the error reply; redis.pcall returns it
        assert_eq!(
            eval("return redis.call('INCR', KEYS[1])", &["k"], &[]),
            Reply::Error(NOT_INTEGER.into())
        );
        assert_eq!(
            eval(
                "local r = redis.pcall('INCR', KEYS[1]); return r.err",
                &["k"],
                &[]
            ),
            bulk(NOT_INTEGER)
        );
        assert!(
            matches!(eval("return redis.call('GET', {})", &[], &[]), Reply::Error(e) if e.contains("strings or integers"))
        );
    }

    #[test]
    fn sandbox_forbids_globals_os_and_nondeterminism() {
        let m = RedisModel::new();
        let eval = |src: &str| cmd(&m, &["EVAL", src, "0"]);
        assert!(matches!(eval("x = 1"), Reply::Error(e) if e.contains("create global variable 'x'")));
        assert!(
            matches!(eval("return os.time()"), Reply::Error(e) if e.contains("nonexistent global variable 'os'"))
        );
        assert!(matches!(eval("return io"), Reply::Error(e) if e.contains("nonexistent global")));
        let first = eval("return {math.random(1000), math.random(1000)}");
        assert_eq!(
            eval("return {math.random(1000), math.random(1000)}"),
            first,
            "reseeded per script"
        );
        assert!(matches!(eval("return ("), Reply::Error(e) if e.starts_with("ERR Error compiling script")));
        assert!(matches!(eval("error('boom')"), Reply::Error(e) if e.contains("boom")));
    }

    #[test]
    fn evalsha_needs_a_loaded_script() {
        let m = RedisModel::new();
        let src = "return ARGV[1]";
        let sha = sha1_hex(src);
        assert!(matches!(m.eval_sha(&sha, &[], &["x".into()]), Reply::Error(e) if e.starts_with("NOSCRIPT")));
        assert_eq!(m.script_load(src), bulk(&sha));
        assert_eq!(m.eval_sha(&sha, &[], &["x".into()]), bulk("x"));
        assert_eq!(
            cmd(&m, &["SCRIPT", "EXISTS", &sha, "nope"]),
            Reply::Array(vec![Reply::Int(1), Reply::Int(0)])
        );
        m.flush_all();
        assert!(matches!(m.eval_sha(&sha, &[], &[]), Reply::Error(e) if e.starts_with("NOSCRIPT")));
    }
}
