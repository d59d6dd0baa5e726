//! The response cache: whole non-streamed replies kept in the edge's memory, so that a repeat of a
//! request (the same tenant, model, route strategy and request members) is answered without an
//! upstream call and at no cost.
//!
//! The key is a SHA-256 digest of the tenant, the model routing resolved, the route strategy and
//! every member of the neutral request that shapes an answer (messages, system, tools, tool choice,
//! response format, temperature, top_p, max_tokens, stop and the rest; not `stream` nor `user`),
//! written through its `Debug` form, so a member added to the request joins the key by itself.
//! Replies are stored as the provider gave them, before the guardian judged them: a hit is judged
//! again under the tenant's policy of the moment. The cache is bounded in bytes: sixteen shards,
//! each evicting its oldest entries first; an entry also lapses with the TTL.
//!
//! Identical requests that arrive together are answered by one upstream call: the first to miss
//! leads ([`Lookup::Lead`]), and the others wait for its answer ([`Lookup::Follow`], [`landed`])
//! instead of paying for the same reply again.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use brainstorm_common::ApiError;
use brainstorm_common::config::ResponseCacheSettings;
use brainstorm_common::money::Usd;
use brainstorm_providers::chat::{ChatReply, ChatRequest, FinishReason};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::header_value;

/// The model a cache hit is settled on in the ledger (at $0), so usage shows hits apart.
pub const CACHE_MODEL: &str = "brainstorm/cache";
/// The provider of a cache hit's settlement and audit record: no provider was called.
pub const CACHE_PROVIDER: &str = "brainstorm";

const SHARDS: usize = 16;
/// The largest reply stored: a bigger one is answered and not kept.
const MAX_ENTRY_BYTES: usize = 1024 * 1024;
/// Bytes an entry costs beyond its reply's text (the map slot, the queue slot, the `Arc`).
const ENTRY_OVERHEAD: usize = 160;

/// A digest of everything that shapes a request's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// The key of `chat` (its `stream` and `user` members left out: they are set aside while the
    /// request is written, and put back) for `tenant_id`, on the model routing resolved with
    /// `strategy`.
    pub fn of(tenant_id: &str, resolved_model: &str, strategy: &str, chat: &mut ChatRequest) -> CacheKey {
        let mut digest = DigestWriter(Sha256::new());
        for part in [tenant_id, resolved_model, strategy] {
            digest.0.update((part.len() as u64).to_le_bytes());
            digest.0.update(part.as_bytes());
        }
        let user = chat.user.take();
        let stream = std::mem::replace(&mut chat.stream, false);
        let stream_usage = std::mem::replace(&mut chat.stream_usage, false);
        let _ = write!(digest, "{chat:?}");
        (chat.user, chat.stream, chat.stream_usage) = (user, stream, stream_usage);
        CacheKey(digest.0.finalize().into())
    }
}

/// Feeds formatted text into a digest without building the text.
struct DigestWriter(Sha256);

impl std::fmt::Write for DigestWriter {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0.update(text.as_bytes());
        Ok(())
    }
}

/// Counts formatted bytes without keeping them.
struct ByteCounter(usize);

impl std::fmt::Write for ByteCounter {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0 += text.len();
        Ok(())
    }
}

/// A stored reply and what it cost when the provider gave it.
#[derive(Debug)]
pub struct CachedReply {
    pub reply: ChatReply,
    /// The model that answered (`provider/model`).
    pub model: String,
    /// What the answer cost then: what each hit saves.
    pub cost: Usd,
    stored_at: Instant,
    bytes: usize,
}

impl CachedReply {
    /// Whole seconds since the reply was stored.
    pub fn age_seconds(&self) -> u64 {
        self.stored_at.elapsed().as_secs()
    }

    /// The tokens the original call consumed, which a hit does not.
    pub fn saved_tokens(&self) -> u64 {
        self.reply.usage.input_tokens.saturating_add(self.reply.usage.output_tokens)
    }
}

#[derive(Default)]
struct Shard {
    entries: HashMap<CacheKey, (u64, Arc<CachedReply>)>,
    /// Keys in the order they were stored, with the generation stored (a replaced entry's old
    /// queue slot no longer matches and evicts nothing).
    order: VecDeque<(CacheKey, u64)>,
    bytes: usize,
    generation: u64,
    /// Keys an upstream call is fetching now, with the flight's id; the receiver closes when the
    /// flight ends.
    flights: HashMap<CacheKey, (u64, watch::Receiver<()>)>,
}

impl Shard {
    fn remove(&mut self, key: &CacheKey, generation: u64) {
        if self.entries.get(key).is_some_and(|(stored, _)| *stored == generation)
            && let Some((_, entry)) = self.entries.remove(key)
        {
            self.bytes = self.bytes.saturating_sub(entry.bytes);
        }
    }
}

/// The edge's response cache (absent when `response_cache_max_bytes` is 0).
pub struct ResponseCache {
    shards: Vec<Mutex<Shard>>,
    ttl: Duration,
    shard_bytes: usize,
}

impl ResponseCache {
    /// A cache as `settings` say, or None when they turn it off.
    pub fn new(settings: ResponseCacheSettings) -> Option<ResponseCache> {
        let max_bytes = usize::try_from(settings.max_bytes).unwrap_or(usize::MAX);
        (max_bytes > 0).then(|| ResponseCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            ttl: settings.ttl,
            shard_bytes: (max_bytes / SHARDS).max(1),
        })
    }

    fn shard(&self, key: &CacheKey) -> std::sync::MutexGuard<'_, Shard> {
        let shard = &self.shards[usize::from(key.0[0]) % SHARDS];
        shard.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The reply stored under `key`, unless it lapsed (it is then dropped); the request path
    /// uses `lookup`.
    #[cfg(test)]
    fn get(&self, key: &CacheKey) -> Option<Arc<CachedReply>> {
        Self::stored(&mut self.shard(key), key, self.ttl)
    }

    fn stored(shard: &mut Shard, key: &CacheKey, ttl: Duration) -> Option<Arc<CachedReply>> {
        let (generation, entry) = shard.entries.get(key)?;
        if entry.stored_at.elapsed() < ttl {
            return Some(entry.clone());
        }
        let generation = *generation;
        shard.remove(key, generation);
        None
    }

    /// The reply stored under `key`; else whether another request is fetching it (follow it) or
    /// this one should (lead: others wait on the returned flight until it drops).
    pub fn lookup(&self, key: &CacheKey) -> Lookup<'_> {
        let mut shard = self.shard(key);
        if let Some(hit) = Self::stored(&mut shard, key, self.ttl) {
            return Lookup::Hit(hit);
        }
        if let Some((_, landed)) = shard.flights.get(key) {
            return Lookup::Follow(landed.clone());
        }
        shard.generation += 1;
        let id = shard.generation;
        let (done, landed) = watch::channel(());
        shard.flights.insert(*key, (id, landed));
        Lookup::Lead(Flight { cache: self, key: *key, id, _done: done })
    }

    /// Stores `reply` (answered by `model` at `cost`) under `key`, evicting the shard's oldest
    /// entries past its share of the bytes. A reply cut short by a content filter, or larger than
    /// a mebibyte, is not kept.
    pub fn put(&self, key: CacheKey, reply: ChatReply, model: &str, cost: Usd) {
        if reply.finish == FinishReason::ContentFilter {
            return;
        }
        let mut counter = ByteCounter(ENTRY_OVERHEAD + model.len());
        let _ = write!(counter, "{reply:?}");
        let bytes = counter.0;
        if bytes > MAX_ENTRY_BYTES || bytes > self.shard_bytes {
            return;
        }
        let entry = Arc::new(CachedReply { reply, model: model.to_string(), cost, stored_at: Instant::now(), bytes });
        let mut shard = self.shard(&key);
        shard.generation += 1;
        let generation = shard.generation;
        if let Some((_, replaced)) = shard.entries.insert(key, (generation, entry)) {
            shard.bytes = shard.bytes.saturating_sub(replaced.bytes);
        }
        shard.bytes += bytes;
        shard.order.push_back((key, generation));
        while shard.bytes > self.shard_bytes {
            let Some((oldest, stored)) = shard.order.pop_front() else { break };
            shard.remove(&oldest, stored);
        }
        // Queue slots of replaced entries are dropped once they outnumber the live ones.
        if shard.order.len() > 2 * shard.entries.len() + 64 {
            let Shard { entries, order, .. } = &mut *shard;
            order.retain(|(key, generation)| entries.get(key).is_some_and(|(stored, _)| stored == generation));
        }
    }
}

/// What a lookup found.
pub enum Lookup<'cache> {
    /// A stored reply.
    Hit(Arc<CachedReply>),
    /// Nothing stored or being fetched: this request fetches it, and identical ones wait on the
    /// flight until it drops (after the reply was stored, or the request gave up).
    Lead(Flight<'cache>),
    /// An identical request is fetching it: wait for it to land ([`landed`]), then look again.
    Follow(watch::Receiver<()>),
}

/// A leading request's claim on a key: while it lives, identical requests wait for its reply.
pub struct Flight<'cache> {
    cache: &'cache ResponseCache,
    key: CacheKey,
    id: u64,
    /// Dropped with the flight, after its entry is gone, which wakes the followers.
    _done: watch::Sender<()>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut shard = self.cache.shard(&self.key);
        if shard.flights.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            shard.flights.remove(&self.key);
        }
    }
}

/// Waits until the flight a follower found has ended (its reply stored, or not: look again).
pub async fn landed(mut flight: watch::Receiver<()>) {
    // Nothing is ever sent: the wait ends when the leader's sender is dropped.
    while flight.changed().await.is_ok() {}
}

/// How the cache takes part in one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// It does not apply (no cache, a stream, a liaison plan's commit): no `X-BR-Cache` header.
    Off,
    /// The request asked to bypass it (`cache: false`, `x_no_cache: true`, `X-BR-Cache-Privacy:
    /// private`): neither read nor written.
    Bypass { private: bool },
    /// Read, and written on a miss.
    Use,
}

impl CacheUse {
    /// The request's choice: `cache` and `x_no_cache` (booleans; anything else is 400
    /// `invalid_cache`) and `X-BR-Cache-Privacy` (`private`, or 400 `invalid_cache_privacy`).
    /// `applies` is false where the cache has no part (no cache, a stream, a plan's commit).
    pub fn of<'body>(applies: bool, member: impl Fn(&str) -> Option<&'body Value>, headers: &HeaderMap) -> Result<CacheUse, ApiError> {
        let flag = |name: &str| match member(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(value)) => Ok(Some(*value)),
            Some(_) => Err(ApiError::invalid_request("invalid_cache", format!("`{name}` is a boolean"))),
        };
        let skipped = flag("cache")? == Some(false) || flag("x_no_cache")? == Some(true);
        let private = match headers.get(&const { HeaderName::from_static("x-br-cache-privacy") }) {
            None => false,
            Some(value) if value.to_str().is_ok_and(|value| value.trim().eq_ignore_ascii_case("private")) => true,
            Some(_) => {
                return Err(ApiError::invalid_request(
                    "invalid_cache_privacy",
                    "X-BR-Cache-Privacy is `private` (the request bypasses the response cache) or absent",
                ));
            }
        };
        Ok(match (applies, skipped || private) {
            (false, _) => CacheUse::Off,
            (true, true) => CacheUse::Bypass { private },
            (true, false) => CacheUse::Use,
        })
    }

    /// `X-BR-Cache` (`miss` or `bypass`; a hit sets its own, see [`hit_headers`]) and, for a private
    /// request, `X-BR-Cache-Privacy: private`.
    pub fn headers(self, headers: &mut HeaderMap) {
        let (state, private) = match self {
            CacheUse::Off => return,
            CacheUse::Bypass { private } => ("bypass", private),
            CacheUse::Use => ("miss", false),
        };
        headers.insert(const { HeaderName::from_static("x-br-cache") }, HeaderValue::from_static(state));
        if private {
            headers.insert(const { HeaderName::from_static("x-br-cache-privacy") }, HeaderValue::from_static("private"));
        }
    }
}

/// The headers of an answer served from `hit`: `X-BR-Cache: hit`, the similarity (1.00: the key
/// matched exactly), its age in seconds, the tokens and dollars saved, and the source (`edge`).
pub fn hit_headers(headers: &mut HeaderMap, hit: &CachedReply) {
    headers.insert(const { HeaderName::from_static("x-br-cache") }, HeaderValue::from_static("hit"));
    headers.insert(const { HeaderName::from_static("x-br-cache-similarity") }, HeaderValue::from_static("1.00"));
    headers.insert(const { HeaderName::from_static("x-br-cache-age") }, HeaderValue::from(hit.age_seconds()));
    headers.insert(const { HeaderName::from_static("x-br-cache-saved-tokens") }, HeaderValue::from(hit.saved_tokens()));
    headers.insert(const { HeaderName::from_static("x-br-cache-source") }, HeaderValue::from_static("edge"));
    if let Some(savings) = header_value::shown(hit.cost.fixed(6)) {
        headers.insert(const { HeaderName::from_static("x-br-savings") }, savings);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brainstorm_providers::chat::{Message, Part, Role, Usage};
    use serde_json::json;

    fn request(prompt: &str) -> ChatRequest {
        let message = Message { role: Role::User, parts: vec![Part::Text(prompt.into())] };
        ChatRequest { model: "auto".into(), messages: vec![message], ..ChatRequest::default() }
    }

    fn reply(text: &str) -> ChatReply {
        ChatReply {
            id: "chatcmpl-1".into(),
            model: "gpt-4o-mini".into(),
            parts: vec![Part::Text(text.into())],
            finish: FinishReason::Stop,
            usage: Usage::uncached(12, 30),
            logprobs: None,
        }
    }

    fn cache(max_bytes: u64, ttl: Duration) -> ResponseCache {
        ResponseCache::new(ResponseCacheSettings { ttl, max_bytes }).expect("a cache")
    }

    #[test]
    fn the_key_follows_what_shapes_the_answer_and_nothing_else() {
        let base = CacheKey::of("t1", "openai/gpt-4o-mini", "quality", &mut request("hi"));
        let mut streamed = ChatRequest { stream: true, stream_usage: true, user: Some("agent-7".into()), ..request("hi") };
        assert_eq!(CacheKey::of("t1", "openai/gpt-4o-mini", "quality", &mut streamed), base, "stream and user do not shape it");
        assert_eq!((streamed.stream, streamed.stream_usage, streamed.user.as_deref()), (true, true, Some("agent-7")), "put back");
        let differs = [
            CacheKey::of("t2", "openai/gpt-4o-mini", "quality", &mut request("hi")),
            CacheKey::of("t1", "openai/gpt-4o", "quality", &mut request("hi")),
            CacheKey::of("t1", "openai/gpt-4o-mini", "price", &mut request("hi")),
            CacheKey::of("t1", "openai/gpt-4o-mini", "quality", &mut request("hi!")),
            CacheKey::of("t1", "openai/gpt-4o-mini", "quality", &mut ChatRequest { temperature: Some(0.7), ..request("hi") }),
            CacheKey::of("t1", "openai/gpt-4o-mini", "quality", &mut ChatRequest { max_tokens: Some(5), ..request("hi") }),
            // The parts are length-prefixed: moving text from one to the next changes the key.
            CacheKey::of("t", "1openai/gpt-4o-mini", "quality", &mut request("hi")),
        ];
        for (index, key) in differs.iter().enumerate() {
            assert_ne!(*key, base, "variant {index}");
        }
    }

    #[test]
    fn a_stored_reply_answers_until_its_ttl_and_a_filtered_one_is_not_kept() {
        let cache = cache(1 << 20, Duration::from_millis(80));
        let key = CacheKey::of("t1", "m", "quality", &mut request("hi"));
        assert!(cache.get(&key).is_none());
        cache.put(key, reply("hello"), "openai/gpt-4o-mini", Usd::from_nanos(1_500));
        let hit = cache.get(&key).expect("stored");
        assert_eq!(
            (hit.reply.text(), hit.model.as_str(), hit.cost, hit.saved_tokens()),
            ("hello".into(), "openai/gpt-4o-mini", Usd::from_nanos(1_500), 42)
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(cache.get(&key).is_none(), "lapsed");
        let filtered = CacheKey::of("t1", "m", "quality", &mut request("bad"));
        cache.put(filtered, ChatReply { finish: FinishReason::ContentFilter, ..reply("") }, "m", Usd::ZERO);
        assert!(cache.get(&filtered).is_none());
    }

    #[tokio::test]
    async fn identical_misses_wait_for_the_first_to_land() {
        let cache = cache(1 << 20, Duration::from_secs(60));
        let key = CacheKey::of("t1", "m", "quality", &mut request("hi"));
        let Lookup::Lead(flight) = cache.lookup(&key) else { panic!("the first miss leads") };
        let Lookup::Follow(waiting) = cache.lookup(&key) else { panic!("the second follows") };
        let Lookup::Follow(also) = cache.lookup(&key) else { panic!("so does the third") };
        let follower = tokio::spawn(landed(waiting));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!follower.is_finished(), "it waits while the leader fetches");
        cache.put(key, reply("hello"), "m", Usd::ZERO);
        drop(flight);
        follower.await.unwrap();
        landed(also).await;
        assert!(matches!(cache.lookup(&key), Lookup::Hit(hit) if hit.reply.text() == "hello"));

        // A leader that stored nothing (a failed call) wakes its followers too, and one of them leads.
        let other = CacheKey::of("t1", "m", "quality", &mut request("other"));
        let Lookup::Lead(failed) = cache.lookup(&other) else { panic!("leads") };
        let Lookup::Follow(waiting) = cache.lookup(&other) else { panic!("follows") };
        drop(failed);
        landed(waiting).await;
        assert!(matches!(cache.lookup(&other), Lookup::Lead(_)), "the next leads in its place");
    }

    #[test]
    fn the_oldest_entries_go_first_when_the_bytes_run_out() {
        // Room for about three entries of this size in each shard.
        let size = {
            let mut counter = ByteCounter(ENTRY_OVERHEAD + 1);
            let _ = write!(counter, "{:?}", reply(&"x".repeat(400)));
            counter.0
        };
        let cache = cache((size * 3 * SHARDS) as u64, Duration::from_secs(60));
        let keys: Vec<CacheKey> = (0..400).map(|index| CacheKey::of("t", "m", "quality", &mut request(&index.to_string()))).collect();
        for key in &keys {
            cache.put(*key, reply(&"x".repeat(400)), "m", Usd::ZERO);
        }
        for shard in &cache.shards {
            let shard = shard.lock().expect("shard");
            assert!(shard.bytes <= cache.shard_bytes && shard.entries.len() <= 3, "{} bytes, {} entries", shard.bytes, shard.entries.len());
            assert!(shard.order.len() <= 2 * shard.entries.len() + 64);
        }
        // The last stored survive; the first went.
        assert!(cache.get(&keys[399]).is_some());
        assert!(cache.get(&keys[0]).is_none());
        // Replacing an entry keeps one copy's bytes.
        cache.put(keys[399], reply(&"x".repeat(400)), "m", Usd::ZERO);
        let shard = cache.shard(&keys[399]);
        assert_eq!(shard.bytes, shard.entries.values().map(|(_, entry)| entry.bytes).sum::<usize>());
    }

    #[test]
    fn off_when_the_size_is_zero() {
        assert!(ResponseCache::new(ResponseCacheSettings { ttl: Duration::from_secs(1), max_bytes: 0 }).is_none());
    }

    #[test]
    fn the_request_chooses_use_or_bypass_and_bad_choices_are_refused() {
        let body = |value: Value| move |name: &str| -> Option<Value> { value.get(name).cloned() };
        let choose = |value: Value, headers: &HeaderMap, applies: bool| {
            let member = body(value);
            let owned: HashMap<String, Value> =
                ["cache", "x_no_cache"].iter().filter_map(|name| member(name).map(|value| (name.to_string(), value))).collect();
            CacheUse::of(applies, |name| owned.get(name), headers)
        };
        let none = HeaderMap::new();
        assert_eq!(choose(json!({}), &none, true).ok(), Some(CacheUse::Use));
        assert_eq!(choose(json!({"cache": true}), &none, true).ok(), Some(CacheUse::Use));
        assert_eq!(choose(json!({"cache": false}), &none, true).ok(), Some(CacheUse::Bypass { private: false }));
        assert_eq!(choose(json!({"x_no_cache": true}), &none, true).ok(), Some(CacheUse::Bypass { private: false }));
        assert_eq!(choose(json!({"cache": false}), &none, false).ok(), Some(CacheUse::Off));
        let mut private = HeaderMap::new();
        private.insert("x-br-cache-privacy", HeaderValue::from_static(" Private"));
        assert_eq!(choose(json!({}), &private, true).ok(), Some(CacheUse::Bypass { private: true }));
        let refused = |result: Result<CacheUse, ApiError>| result.err().and_then(|error| error.code.clone());
        assert_eq!(refused(choose(json!({"cache": "no"}), &none, true)).as_deref(), Some("invalid_cache"));
        assert_eq!(refused(choose(json!({"x_no_cache": 1}), &none, false)).as_deref(), Some("invalid_cache"));
        let mut public = HeaderMap::new();
        public.insert("x-br-cache-privacy", HeaderValue::from_static("public"));
        assert_eq!(refused(choose(json!({}), &public, true)).as_deref(), Some("invalid_cache_privacy"));
    }
}
