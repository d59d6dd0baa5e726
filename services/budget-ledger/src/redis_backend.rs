//! The distributed counters and rate limiter: Redis, one Lua script per operation.
//!
//! Atomicity: Redis runs a script to completion before serving any other command, so the check of every
//! scope and the increment of every scope in `reserve` happen with no other client's write in between;
//! two edge replicas calling `reserve` concurrently are serialised by the server. The scripts are
//! invoked with EVALSHA; on `NOSCRIPT` (a restarted or flushed server) the same call is sent with EVAL,
//! which runs the script whatever the cache holds and caches it again for the next EVALSHA.
//!
//! Exactness: Lua numbers are doubles, so the scripts never do arithmetic on money. Comparisons are done
//! on the decimal text of int64 values (`cmp` below), the threshold `limit - amount` is computed in Rust
//! with i64, and every increment is Redis's own int64 `INCRBY` on a decimal string argument. Levels are
//! read back with `GET` (text), never through a Lua number.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, FromRedisValue, Script, ServerErrorKind};

use crate::counters::{
    CounterError, Exhausted, RESERVATION_TTL_SECONDS, ReservationId, Reserved, Scope, ScopeLevel, ScopeLimit, SpendCounters, Usage,
    validate_scopes,
};
use crate::period::counter_ttl_seconds;
use crate::rate_limit::{RateDecision, RateLimiter, WINDOW_MICROS, emission_interval_micros};

/// Exact comparison of two canonical decimal int64 strings: -1, 0 or 1.
const LUA_CMP: &str = r#"
local function cmp(a, b)
  local a_negative = string.sub(a, 1, 1) == '-'
  local b_negative = string.sub(b, 1, 1) == '-'
  if a_negative and not b_negative then return -1 end
  if b_negative and not a_negative then return 1 end
  local a_digits = a_negative and string.sub(a, 2) or a
  local b_digits = b_negative and string.sub(b, 2) or b
  local result = 0
  if #a_digits ~= #b_digits then
    result = (#a_digits < #b_digits) and -1 or 1
  elseif a_digits ~= b_digits then
    result = (a_digits < b_digits) and -1 or 1
  end
  if a_negative then return -result end
  return result
end
"#;

/// KEYS[1]: the reservation marker; KEYS[2..]: the counters.
/// ARGV[1]: marker TTL (s); ARGV[2]: marker value; then four per counter i (base = 2 + 4 (i - 1)):
/// amount, limit ('' for none), limit - amount (threshold), counter TTL (s).
/// Returns {'1', level...} or {'0', index of the refusing counter, its spent}.
const LUA_RESERVE: &str = r#"
local counters = #KEYS - 1
for i = 1, counters do
  local base = 2 + (i - 1) * 4
  local limit = ARGV[base + 2]
  if limit ~= '' then
    local spent = redis.call('GET', KEYS[i + 1]) or '0'
    if cmp(spent, limit) >= 0 or cmp(spent, ARGV[base + 3]) > 0 then
      return {'0', tostring(i), spent}
    end
  end
end
local levels = {'1'}
for i = 1, counters do
  local base = 2 + (i - 1) * 4
  redis.call('INCRBY', KEYS[i + 1], ARGV[base + 1])
  if redis.call('TTL', KEYS[i + 1]) < 0 then
    redis.call('EXPIRE', KEYS[i + 1], ARGV[base + 4])
  end
  levels[#levels + 1] = redis.call('GET', KEYS[i + 1])
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1])
return levels
"#;

/// KEYS[1]: the reservation marker; KEYS[2..]: the counters. ARGV: two per counter i (base = 2 (i - 1)):
/// delta (actual - reserved), counter TTL (s). Applies the deltas only if the marker still exists (it is
/// deleted in the same step, so a reservation settles at most once). Returns {'1' or '0', level...}.
const LUA_SETTLE: &str = r#"
local applied = redis.call('DEL', KEYS[1])
local levels = {tostring(applied)}
for i = 1, #KEYS - 1 do
  local base = (i - 1) * 2
  if applied == 1 and ARGV[base + 1] ~= '0' then
    redis.call('INCRBY', KEYS[i + 1], ARGV[base + 1])
    if redis.call('TTL', KEYS[i + 1]) < 0 then
      redis.call('EXPIRE', KEYS[i + 1], ARGV[base + 2])
    end
  end
  levels[#levels + 1] = redis.call('GET', KEYS[i + 1]) or '0'
end
return levels
"#;

/// GCRA (see `rate_limit`) on the server's clock, so every replica shares one time line.
/// KEYS[1]: the key's TAT (microseconds, decimal text). ARGV[1]: emission interval (µs); ARGV[2]: window (µs).
/// Microsecond timestamps (~1.8e15) are below 2^53, where doubles are exact integers.
/// Returns {allowed 1|0, remaining, retry_after_ms}.
const LUA_RATE_LIMIT: &str = r#"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval
local ahead = new_tat - now
if ahead > window then
  return {0, 0, math.ceil((ahead - window) / 1000)}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', string.format('%.0f', math.ceil(ahead / 1000) + 1))
return {1, math.floor((window - ahead) / interval), 0}
"#;

/// How much of the rate a key takes up now (`ceil((tat - now) / T)`), by the server's clock as the
/// limiter itself reads it; writes nothing.
const LUA_RATE_USED: &str = r#"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat <= now then return 0 end
return math.ceil((tat - now) / interval)
"#;

/// A Lua script called by its SHA1 (EVALSHA), falling back to EVAL when the server does not have it.
#[derive(Clone)]
struct LuaScript {
    code: String,
    sha1: String,
}

impl LuaScript {
    fn new(code: String) -> Self {
        let sha1 = Script::new(&code).get_hash().to_string();
        LuaScript { code, sha1 }
    }

    async fn call<T: FromRedisValue>(
        &self,
        connection: &mut ConnectionManager,
        keys: &[String],
        args: &[String],
    ) -> Result<T, CounterError> {
        let command = |verb: &str, script: &str| {
            let mut command = redis::cmd(verb);
            command.arg(script).arg(keys.len()).arg(keys).arg(args);
            command
        };
        match command("EVALSHA", &self.sha1).query_async(connection).await {
            Err(error) if error.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                command("EVAL", &self.code).query_async(connection).await.map_err(backend)
            }
            result => result.map_err(backend),
        }
    }
}

/// Opens a reconnecting Redis connection (`redis://host:port[/db]`), shared by counters and limiter.
pub async fn connect_redis(url: &str) -> Result<ConnectionManager, CounterError> {
    let client = redis::Client::open(url).map_err(backend)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(3);
    ConnectionManager::new_with_config(client, config).await.map_err(backend)
}

fn backend(error: redis::RedisError) -> CounterError {
    CounterError::Backend(error.to_string())
}

fn parse_level(text: &str) -> Result<i64, CounterError> {
    text.parse().map_err(|_| CounterError::Backend(format!("counter holds `{text}`, not an integer")))
}

/// Budget counters in Redis, shared by every edge replica that uses the same server and prefix.
#[derive(Clone)]
pub struct RedisCounters {
    connection: ConnectionManager,
    prefix: String,
    reserve_script: LuaScript,
    settle_script: LuaScript,
}

impl RedisCounters {
    /// Counters under keys `<prefix>:c:...` (reservations under `<prefix>:r:...`).
    pub fn new(connection: ConnectionManager, prefix: impl Into<String>) -> Self {
        RedisCounters {
            connection,
            prefix: prefix.into(),
            reserve_script: LuaScript::new(format!("{LUA_CMP}{LUA_RESERVE}")),
            settle_script: LuaScript::new(LUA_SETTLE.to_string()),
        }
    }

    /// Connects to `url` and uses `prefix`.
    pub async fn connect(url: &str, prefix: impl Into<String>) -> Result<Self, CounterError> {
        Ok(Self::new(connect_redis(url).await?, prefix))
    }

    fn counter_key(&self, scope: &Scope) -> String {
        format!("{}:c:{}", self.prefix, scope.counter_key())
    }

    fn marker_key(&self, reservation: &ReservationId) -> String {
        format!("{}:r:{}", self.prefix, reservation.as_str())
    }

    fn levels_from(scopes: &[ScopeLimit], values: &[String]) -> Result<Vec<ScopeLevel>, CounterError> {
        if values.len() != scopes.len() {
            return Err(CounterError::Backend(format!("expected {} levels, got {}", scopes.len(), values.len())));
        }
        scopes
            .iter()
            .zip(values)
            .map(|(scope, value)| Ok(ScopeLevel { scope: scope.scope.clone(), limit: scope.limit, spent: parse_level(value)? }))
            .collect()
    }
}

#[async_trait]
impl SpendCounters for RedisCounters {
    async fn reserve(&self, scopes: &[ScopeLimit], amount: Usage) -> Result<Reserved, CounterError> {
        validate_scopes(scopes, amount)?;
        let now = Utc::now();
        let reservation = ReservationId::new(scopes, amount);
        let mut keys = vec![self.marker_key(&reservation)];
        let mut args = vec![RESERVATION_TTL_SECONDS.to_string(), format!("{}:{}:{}", amount.cost.nanos(), amount.tokens, amount.requests)];
        for scope in scopes {
            let scope_amount = amount.amount_for(scope.scope.kind.meter());
            keys.push(self.counter_key(&scope.scope));
            args.push(scope_amount.to_string());
            match scope.limit {
                Some(limit) => args.extend([limit.to_string(), limit.saturating_sub(scope_amount).to_string()]),
                None => args.extend([String::new(), String::new()]),
            }
            args.push(counter_ttl_seconds(&scope.scope.period_key, now).to_string());
        }
        let mut connection = self.connection.clone();
        let reply: Vec<String> = self.reserve_script.call(&mut connection, &keys, &args).await?;
        match reply.split_first() {
            Some((status, levels)) if status == "1" => Ok(Reserved { levels: Self::levels_from(scopes, levels)?, reservation }),
            Some((status, refusal)) if status == "0" => {
                let (index, spent) = match refusal {
                    [index, spent] => (index.parse::<usize>().unwrap_or(0), parse_level(spent)?),
                    _ => return Err(CounterError::Backend("malformed refusal from the reserve script".to_string())),
                };
                let scope = index.checked_sub(1).and_then(|index| scopes.get(index));
                let Some(scope) = scope else {
                    return Err(CounterError::Backend(format!("the reserve script refused unknown scope {index}")));
                };
                Err(CounterError::Exhausted(Exhausted { scope: scope.scope.clone(), limit: scope.limit.unwrap_or(i64::MAX), spent }))
            }
            _ => Err(CounterError::Backend("malformed reply from the reserve script".to_string())),
        }
    }

    async fn settle(&self, reservation: &ReservationId, actual: Usage) -> Result<Vec<ScopeLevel>, CounterError> {
        let now = Utc::now();
        let mut keys = vec![self.marker_key(reservation)];
        let mut args = Vec::with_capacity(reservation.scopes().len() * 2);
        for (scope, delta) in reservation.scopes().iter().zip(reservation.deltas(actual)) {
            keys.push(self.counter_key(&scope.scope));
            args.extend([delta.to_string(), counter_ttl_seconds(&scope.scope.period_key, now).to_string()]);
        }
        let mut connection = self.connection.clone();
        let reply: Vec<String> = self.settle_script.call(&mut connection, &keys, &args).await?;
        match reply.split_first() {
            Some((_, levels)) => Self::levels_from(reservation.scopes(), levels),
            None => Err(CounterError::Backend("empty reply from the settle script".to_string())),
        }
    }

    async fn release(&self, reservation: &ReservationId) -> Result<(), CounterError> {
        self.settle(reservation, Usage::default()).await.map(|_| ())
    }

    async fn spent(&self, scope: &Scope) -> Result<i64, CounterError> {
        let mut connection = self.connection.clone();
        let value: Option<String> = connection.get(self.counter_key(scope)).await.map_err(backend)?;
        value.as_deref().map_or(Ok(0), parse_level)
    }

    async fn levels(&self, scopes: &[ScopeLimit]) -> Result<Vec<ScopeLevel>, CounterError> {
        if scopes.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = scopes.iter().map(|scope| self.counter_key(&scope.scope)).collect();
        let mut connection = self.connection.clone();
        let values: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query_async(&mut connection).await.map_err(backend)?;
        let values: Vec<String> = values.into_iter().map(|value| value.unwrap_or_else(|| "0".to_string())).collect();
        Self::levels_from(scopes, &values)
    }

    async fn seed(&self, scope: &Scope, value: i64) -> Result<bool, CounterError> {
        let ttl = counter_ttl_seconds(&scope.period_key, Utc::now());
        let mut connection = self.connection.clone();
        let set: Option<String> = redis::cmd("SET")
            .arg(self.counter_key(scope))
            .arg(value)
            .arg("NX")
            .arg("EX")
            .arg(ttl)
            .query_async(&mut connection)
            .await
            .map_err(backend)?;
        Ok(set.is_some())
    }
}

/// The rate limiter in Redis, shared by every edge replica that uses the same server and prefix.
#[derive(Clone)]
pub struct RedisRateLimiter {
    connection: ConnectionManager,
    prefix: String,
    script: LuaScript,
    used_script: LuaScript,
}

impl RedisRateLimiter {
    /// A limiter under keys `<prefix>:rl:<key id>`.
    pub fn new(connection: ConnectionManager, prefix: impl Into<String>) -> Self {
        RedisRateLimiter {
            connection,
            prefix: prefix.into(),
            script: LuaScript::new(LUA_RATE_LIMIT.to_string()),
            used_script: LuaScript::new(LUA_RATE_USED.to_string()),
        }
    }
}

#[async_trait]
impl RateLimiter for RedisRateLimiter {
    async fn check(&self, key_id: &str, rpm: u32) -> Result<RateDecision, CounterError> {
        let keys = [format!("{}:rl:{key_id}", self.prefix)];
        let args = [emission_interval_micros(rpm).to_string(), WINDOW_MICROS.to_string()];
        let mut connection = self.connection.clone();
        let (allowed, remaining, retry_after_ms): (i64, i64, i64) = self.script.call(&mut connection, &keys, &args).await?;
        Ok(RateDecision {
            allowed: allowed == 1,
            remaining: u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
            retry_after_ms: u64::try_from(retry_after_ms.max(0)).unwrap_or(u64::MAX),
        })
    }

    async fn used(&self, key_id: &str, rpm: u32) -> Result<u32, CounterError> {
        let keys = [format!("{}:rl:{key_id}", self.prefix)];
        let args = [emission_interval_micros(rpm).to_string()];
        let mut connection = self.connection.clone();
        let used: i64 = self.used_script.call(&mut connection, &keys, &args).await?;
        Ok(u32::try_from(used.max(0)).unwrap_or(u32::MAX).min(rpm))
    }
}
