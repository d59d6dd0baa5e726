//! Small texts made on the request path in one allocation of their exact length: `format!` runs the
//! formatting machinery (a `Formatter`, padding for each `{}`) and grows its `String` from a guessed
//! capacity, about a thousand instructions for an id or a URL, several times per request.

/// `parts` joined end to end, in one allocation of the exact length.
pub fn concat(parts: &[&str]) -> String {
    let mut text = String::with_capacity(parts.iter().map(|part| part.len()).sum());
    for part in parts {
        text.push_str(part);
    }
    text
}

/// `prefix` followed by `id` as 32 lowercase hex digits (the UUID's simple form), in one allocation.
pub fn prefixed_uuid(prefix: &str, id: uuid::Uuid) -> String {
    concat(&[prefix, id.simple().encode_lower(&mut uuid::Uuid::encode_buffer())])
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
    fn concat_joins_parts_at_their_exact_length() {
        let joined = concat(&["tool:", "lookup", "", ",search"]);
        assert_eq!(joined, "tool:lookup,search");
        assert_eq!(joined.capacity(), joined.len());
        assert_eq!(concat(&[]), "");
    }

    #[test]
    fn uuids_read_as_their_display_forms() {
        let id = uuid::Uuid::now_v7();
        assert_eq!(prefixed_uuid("req_", id), format!("req_{}", id.simple()));
        assert_eq!(simple_uuid(id), id.simple().to_string());
        assert_eq!(hyphenated_uuid(id), id.to_string());
    }
}
