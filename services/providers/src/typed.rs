//! Pieces shared by the typed readings of client bodies (`openai::read_request`,
//! `anthropic::read_request`), which take a body only when they read it exactly as the `Value`
//! tree readings would.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Error as _, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::chat::{Schema, scan_schema};

/// `T` read from a JSON body whose UTF-8 is checked once, up front: read from bytes, serde_json checks
/// every string it meets on its own (about fifty per request, each a call with its own setup). A body
/// that is not UTF-8 is read from its bytes as before, so it fails with the same error.
pub(crate) fn from_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> serde_json::Result<T> {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    }
}

/// A JSON object read as `T`. A derived struct also reads from an array (its members in order),
/// which the tree readings never do, so every struct of a typed reading is read through this.
pub(crate) struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Members<T> {
            type Value = Object<T>;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Object<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(Object)
            }
        }
        deserializer.deserialize_map(Members(PhantomData))
    }
}

/// A member the tree reading ignores, read only to check it as that reading does: UTF-8, escapes
/// and number ranges (serde's own skipping of unknown members checks none of them, so a body with
/// a member neither here nor declared is left to the tree reading).
pub(crate) struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Everything;
        impl<'de> Visitor<'de> for Everything {
            type Value = Checked;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_unit<E>(self) -> Result<Checked, E> {
                Ok(Checked)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Checked, A::Error> {
                while items.next_element::<Checked>()?.is_some() {}
                Ok(Checked)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Checked, A::Error> {
                while members.next_entry::<Checked, Checked>()?.is_some() {}
                Ok(Checked)
            }
        }
        deserializer.deserialize_any(Everything)
    }
}

/// The deepest nesting of a schema the typed readings take. The tree readings' depth limit (128)
/// counts from the body's root, a schema's own check from the schema's: a schema nested deeper than
/// this is left to the tree reading, so both refuse the same bodies.
const SCHEMA_DEPTH: usize = 64;

/// A member's JSON text as a `Schema`, with no tree built: taken as sent (serde_json's skipping of it
/// checks its syntax, strings and escapes) and scanned once (`scan_schema`). Text the tree reading
/// could still refuse (a number with an exponent, a surrogate escape) is read once more as it would
/// read it (`Checked`, which allocates nothing). Some whenever the member is there, `null` included;
/// a schema nested deeper than `SCHEMA_DEPTH` errs, leaving the body to the tree reading.
pub(crate) fn schema<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Schema>, D::Error> {
    let raw = <&'de RawValue>::deserialize(deserializer)?;
    let scan = scan_schema(raw.get());
    if scan.depth > SCHEMA_DEPTH {
        return Err(D::Error::custom("schema nested too deep for the typed reading"));
    }
    if !scan.plain {
        serde_json::from_str::<Checked>(raw.get()).map_err(D::Error::custom)?;
    }
    Ok(Some(Schema::from_raw(raw.to_owned(), &scan)))
}

/// A positive `u32` token count, as `optional_positive_u32` takes one; None for any other number.
pub(crate) fn positive_u32(tokens: u64) -> Option<u32> {
    u32::try_from(tokens).ok().filter(|tokens| *tokens >= 1)
}

/// An optional number as `optional_number_in` takes it: Some(the number or None) when it is
/// absent or in `low..=high`; None when it is out of range.
pub(crate) fn within(number: Option<f64>, low: f64, high: f64) -> Option<Option<f64>> {
    match number {
        None => Some(None),
        Some(number) => (low..=high).contains(&number).then_some(Some(number)),
    }
}

/// The differential checks both typed readings' tests run against their tree readings.
#[cfg(test)]
pub(crate) mod differential {
    use serde_json::Value;

    use crate::chat::{ChatRequest, InvalidRequest};

    /// Each body is read typed, and as the tree reading reads it.
    pub fn common_bodies_read_alike(
        read: fn(&[u8]) -> Option<ChatRequest>,
        parse: fn(&Value) -> Result<ChatRequest, InvalidRequest>,
        bodies: Vec<Value>,
    ) -> Result<(), serde_json::Error> {
        for body in bodies {
            let typed = read(&serde_json::to_vec(&body)?);
            assert!(typed.is_some(), "not read typed: {body}");
            assert_eq!(typed.map(Ok), Some(parse(&body)), "{body}");
        }
        Ok(())
    }

    /// Each body is left to the tree reading, or read as it reads it.
    pub fn other_bodies_left_or_read_alike(
        read: fn(&[u8]) -> Option<ChatRequest>,
        parse: fn(&Value) -> Result<ChatRequest, InvalidRequest>,
        bodies: Vec<Value>,
    ) -> Result<(), serde_json::Error> {
        for body in bodies {
            if let Some(typed) = read(&serde_json::to_vec(&body)?) {
                assert_eq!(Ok(typed), parse(&body), "{body}");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::Value;

    use super::{from_json, schema};
    use crate::chat::Schema;

    #[derive(Deserialize)]
    struct Member {
        #[serde(default, deserialize_with = "schema")]
        schema: Option<Schema>,
    }

    #[test]
    fn schemas_are_taken_as_sent_and_checked_as_the_tree_reads_them() {
        let read = |body: &str| from_json::<Member>(body.as_bytes()).map(|member| member.schema.map(|schema| schema.text().to_string()));
        assert_eq!(read(r#"{"schema": { "type" : "object" } }"#).ok(), Some(Some(r#"{ "type" : "object" }"#.to_string())));
        assert_eq!(read(r#"{"schema": null}"#).ok(), Some(Some("null".to_string())));
        assert_eq!(read("{}").ok(), Some(None));
        // Exponents and surrogate pairs are read once more, and taken when the tree reading takes them.
        let checked = r#"{ "maximum": 1e3, "title": "\ud83d\ude00" }"#;
        assert_eq!(read(&format!(r#"{{"schema": {checked}}}"#)).ok(), Some(Some(checked.to_string())));
        // What the tree reading refuses is refused: a number out of range, a lone surrogate.
        for refused in [r#"{"schema": {"maximum": 1e400}}"#, r#"{"schema": {"title": "\ud800"}}"#] {
            assert!(read(refused).is_err(), "{refused}");
            assert!(serde_json::from_str::<Value>(refused).is_err(), "{refused}");
        }
        let deep = format!("{{\"schema\": {}1{}}}", "[".repeat(65), "]".repeat(65));
        assert!(read(&deep).is_err(), "left to the tree reading");
        let fine = format!("{{\"schema\": {}1{}}}", "[".repeat(64), "]".repeat(64));
        assert!(read(&fine).is_ok());
    }

    #[test]
    fn bodies_read_as_from_their_bytes() {
        let bodies: [&[u8]; 5] = [
            br#"{"text":"caf\u00e9 \ud83d\ude00","n":[1,2.5,-3]}"#,
            "{\"text\":\"café 😀\"}".as_bytes(),
            b"{\"text\":\"caf\xff\"}",
            b"{\"text\":\"unterminated}",
            b"\xef\xbb\xbf{}",
        ];
        for body in bodies {
            let ours = from_json::<Value>(body).map_err(|error| error.to_string());
            let theirs = serde_json::from_slice::<Value>(body).map_err(|error| error.to_string());
            assert_eq!(ours, theirs, "{}", String::from_utf8_lossy(body));
        }
    }
}
