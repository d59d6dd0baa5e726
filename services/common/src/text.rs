//! UUIDs as text without the formatting machinery: `format!` and `to_string` run a `Formatter`
//! (padding for each `{}`) and grow their `String` from a guessed capacity, about a thousand
//! instructions for an id, several times per request. (Other short texts on the request path are
//! joined with `[..].concat()`, one allocation of the exact length.)

/// `prefix` followed by `id` as 32 lowercase hex digits (the UUID's simple form), in one allocation.
pub fn prefixed_uuid(prefix: &str, id: uuid::Uuid) -> String {
    [prefix, id.simple().encode_lower(&mut uuid::Uuid::encode_buffer())].concat()
}

/// `id` as 32 lowercase hex digits (the UUID's simple form).
pub fn simple_uuid(id: uuid::Uuid) -> String {
    prefixed_uuid("", id)
}

/// `id` in its hyphenated form (`0190c6c0-...`), as `Display` writes it.
pub fn hyphenated_uuid(id: uuid::Uuid) -> String {
    id.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_read_as_their_display_forms() {
        let id = uuid::Uuid::now_v7();
        assert_eq!(prefixed_uuid("req_", id), format!("req_{}", id.simple()));
        assert_eq!(simple_uuid(id), id.simple().to_string());
        assert_eq!(hyphenated_uuid(id), id.to_string());
    }
}
