//! Pieces shared by the typed readings of client bodies (`openai::read_request`,
//! `anthropic::read_request`), which take a body only when they read it exactly as the `Value`
//! tree readings would.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

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
    use serde_json::Value;

    use super::from_json;

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
