//! Hash maps for the request path: std's maps with foldhash's seeded quality hasher instead of
//! SipHash (the caches, counters and queues the edge looks up several times per request, keyed by
//! tenant ids, digests and names; SipHash cost about 60 hashes of 80 instructions per request).

/// A `std::collections::HashMap` hashed by foldhash (seeded per process); build with `default()`.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;
