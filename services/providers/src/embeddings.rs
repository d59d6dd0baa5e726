//! Embeddings: the OpenAI request clients send (`POST /v1/embeddings`), the provider formats that
//! have them (OpenAI's `/embeddings`, Gemini's `batchEmbedContents`), and the answer clients read.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use serde_json::{Value, json};

use crate::chat::InvalidRequest;

/// At most this many inputs in one request (OpenAI's own limit).
pub const MAX_INPUTS: usize = 2048;

/// An embeddings request, whatever the provider.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingRequest {
    pub model: String,
    /// The texts to embed, in order.
    pub inputs: Vec<String>,
    /// The vectors' length, for models that can shorten them.
    pub dimensions: Option<u32>,
    /// Whether the client wants each vector as base64 of little-endian `f32`s (OpenAI's
    /// `encoding_format: base64`, the default of OpenAI's own SDKs) rather than a JSON array.
    pub base64: bool,
    pub user: Option<String>,
}

impl EmbeddingRequest {
    /// The gateway's estimate of the input tokens (a token is about four characters, plus one a text).
    pub fn estimated_tokens(&self) -> u64 {
        let characters: usize = self.inputs.iter().map(|input| input.chars().count()).sum();
        (characters as u64).div_ceil(4) + self.inputs.len() as u64
    }
}

/// The vectors a provider answered, in the inputs' order, and the input tokens it counted (None
/// where the format reports none: Gemini's).
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingReply {
    pub vectors: Vec<Vec<f32>>,
    pub input_tokens: Option<u64>,
}

/// Reads a client's OpenAI embeddings body.
pub fn parse_request(body: &Value) -> Result<EmbeddingRequest, InvalidRequest> {
    let Some(members) = body.as_object() else { return Err(InvalidRequest::new("the body must be a JSON object")) };
    let model = match members.get("model") {
        Some(Value::String(model)) if !model.trim().is_empty() => model.clone(),
        Some(Value::String(_)) | None | Some(Value::Null) => return Err(InvalidRequest::missing("model")),
        Some(_) => return Err(InvalidRequest::new("model must be a string")),
    };
    let inputs = match members.get("input") {
        None | Some(Value::Null) => return Err(InvalidRequest::missing("input")),
        Some(Value::String(text)) => vec![text.clone()],
        Some(Value::Array(items)) => {
            let mut inputs = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                match item {
                    Value::String(text) => inputs.push(text.clone()),
                    Value::Number(_) | Value::Array(_) => {
                        return Err(InvalidRequest::unsupported(
                            "input as token ids is not supported (their tokenizer is one provider's): send the text",
                        ));
                    }
                    _ => return Err(InvalidRequest::new(format!("input[{index}] must be a string"))),
                }
            }
            inputs
        }
        Some(_) => return Err(InvalidRequest::new("input must be a string or an array of strings")),
    };
    if inputs.is_empty() {
        return Err(InvalidRequest::new("input must not be empty"));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(InvalidRequest::new(format!("input holds {} texts; at most {MAX_INPUTS} are embedded at once", inputs.len())));
    }
    if let Some(index) = inputs.iter().position(String::is_empty) {
        return Err(InvalidRequest::new(format!("input[{index}] is empty")));
    }
    let dimensions = match members.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_u64()
                .filter(|dimensions| *dimensions > 0)
                .and_then(|dimensions| u32::try_from(dimensions).ok())
                .ok_or_else(|| InvalidRequest::new("dimensions must be a positive integer"))?,
        ),
    };
    let base64 = match members.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(format)) if format == "float" => false,
        Some(Value::String(format)) if format == "base64" => true,
        Some(_) => return Err(InvalidRequest::new("encoding_format must be float or base64")),
    };
    let user = match members.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(user)) => Some(user.clone()),
        Some(_) => return Err(InvalidRequest::new("user must be a string")),
    };
    Ok(EmbeddingRequest { model, inputs, dimensions, base64, user })
}

/// The body sent to an OpenAI-format provider (vectors always asked as floats: the gateway reads them).
pub fn openai_body(request: &EmbeddingRequest, upstream_model: &str) -> Value {
    let mut body = json!({"model": upstream_model, "input": request.inputs, "encoding_format": "float"});
    if let Some(dimensions) = request.dimensions {
        body["dimensions"] = json!(dimensions);
    }
    if let Some(user) = &request.user {
        body["user"] = json!(user);
    }
    body
}

/// The body sent to Gemini's `batchEmbedContents`: one request per input.
pub fn gemini_body(request: &EmbeddingRequest, upstream_model: &str) -> Value {
    let model = format!("models/{upstream_model}");
    let requests: Vec<Value> = request
        .inputs
        .iter()
        .map(|input| {
            let mut one = json!({"model": model, "content": {"parts": [{"text": input}]}});
            if let Some(dimensions) = request.dimensions {
                one["outputDimensionality"] = json!(dimensions);
            }
            one
        })
        .collect();
    json!({"requests": requests})
}

/// An OpenAI-format provider's answer: `data[].embedding` (floats, or base64 where it sent those)
/// placed by `index`, and `usage.prompt_tokens`.
pub fn parse_openai_reply(body: &[u8], inputs: usize) -> Result<EmbeddingReply, String> {
    let body: Value = serde_json::from_slice(body).map_err(|error| format!("undecodable embeddings reply: {error}"))?;
    let data = body.get("data").and_then(Value::as_array).ok_or("the embeddings reply carries no `data`")?;
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs];
    for (position, item) in data.iter().enumerate() {
        let index = item.get("index").and_then(Value::as_u64).map_or(position, |index| index as usize);
        let vector = match item.get("embedding") {
            Some(Value::Array(values)) => values.iter().map(|value| value.as_f64().map(|value| value as f32)).collect::<Option<Vec<f32>>>(),
            Some(Value::String(encoded)) => decode_base64(encoded),
            _ => None,
        }
        .ok_or_else(|| format!("embedding {index} is neither numbers nor base64 floats"))?;
        let slot = vectors.get_mut(index).ok_or_else(|| format!("embedding {index} answers no input"))?;
        *slot = Some(vector);
    }
    let vectors = vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| vector.ok_or(format!("input {index} got no embedding")))
        .collect::<Result<_, _>>()?;
    Ok(EmbeddingReply { vectors, input_tokens: body.pointer("/usage/prompt_tokens").and_then(Value::as_u64) })
}

/// Gemini's answer: `embeddings[].values`, in the requests' order (it reports no token count).
pub fn parse_gemini_reply(body: &[u8], inputs: usize) -> Result<EmbeddingReply, String> {
    let body: Value = serde_json::from_slice(body).map_err(|error| format!("undecodable embeddings reply: {error}"))?;
    let embeddings = body.get("embeddings").and_then(Value::as_array).ok_or("the embeddings reply carries no `embeddings`")?;
    if embeddings.len() != inputs {
        return Err(format!("{} embeddings answer {inputs} inputs", embeddings.len()));
    }
    let vectors = embeddings
        .iter()
        .enumerate()
        .map(|(index, embedding)| {
            embedding
                .get("values")
                .and_then(Value::as_array)
                .and_then(|values| values.iter().map(|value| value.as_f64().map(|value| value as f32)).collect::<Option<Vec<f32>>>())
                .ok_or_else(|| format!("embedding {index} carries no numbers"))
        })
        .collect::<Result<_, _>>()?;
    Ok(EmbeddingReply { vectors, input_tokens: None })
}

fn decode_base64(encoded: &str) -> Option<Vec<f32>> {
    let bytes = STANDARD.decode(encoded).ok()?;
    (bytes.len() % 4 == 0)
        .then(|| bytes.chunks_exact(4).map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]])).collect())
}

/// The answer as OpenAI writes it: `{object: list, data[{object: embedding, index, embedding}], model, usage}`.
#[derive(Debug, Serialize)]
pub struct RenderedReply<'a> {
    object: &'static str,
    data: Vec<RenderedEmbedding>,
    model: &'a str,
    usage: RenderedUsage,
}

#[derive(Debug, Serialize)]
struct RenderedEmbedding {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

/// A vector as floats, or as base64 of its little-endian `f32`s.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
struct RenderedUsage {
    prompt_tokens: u64,
    total_tokens: u64,
}

/// The client's answer for `reply` (its vectors moved in), named `model`, with `input_tokens` counted.
pub fn render_reply(reply: EmbeddingReply, model: &str, input_tokens: u64, base64: bool) -> RenderedReply<'_> {
    let data = reply
        .vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| RenderedEmbedding {
            object: "embedding",
            index,
            embedding: if base64 {
                Vector::Base64(STANDARD.encode(vector.iter().flat_map(|value| value.to_le_bytes()).collect::<Vec<u8>>()))
            } else {
                Vector::Floats(vector)
            },
        })
        .collect();
    RenderedReply { object: "list", data, model, usage: RenderedUsage { prompt_tokens: input_tokens, total_tokens: input_tokens } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_bodies_are_read_and_checked() -> Result<(), InvalidRequest> {
        let request = parse_request(&json!({"model": "openai/text-embedding-3-small", "input": ["a cat", "a dog"], "dimensions": 4,
                                            "encoding_format": "base64", "user": "u1"}))?;
        assert_eq!(
            request,
            EmbeddingRequest {
                model: "openai/text-embedding-3-small".to_string(),
                inputs: vec!["a cat".to_string(), "a dog".to_string()],
                dimensions: Some(4),
                base64: true,
                user: Some("u1".to_string()),
            }
        );
        assert_eq!(parse_request(&json!({"model": "m", "input": "one"}))?.inputs, vec!["one".to_string()]);
        let code = |body: Value| parse_request(&body).err().map(|error| error.code);
        assert_eq!(code(json!({"input": "x"})), Some("missing_field"));
        assert_eq!(code(json!({"model": "m"})), Some("missing_field"));
        assert_eq!(code(json!({"model": "m", "input": []})), Some("invalid_request"));
        assert_eq!(code(json!({"model": "m", "input": ["ok", ""]})), Some("invalid_request"));
        assert_eq!(code(json!({"model": "m", "input": [1, 2, 3]})), Some("unsupported_content"));
        assert_eq!(code(json!({"model": "m", "input": [[1, 2]]})), Some("unsupported_content"));
        assert_eq!(code(json!({"model": "m", "input": "x", "dimensions": 0})), Some("invalid_request"));
        assert_eq!(code(json!({"model": "m", "input": "x", "encoding_format": "int8"})), Some("invalid_request"));
        assert_eq!(code(json!({"model": "m", "input": vec!["x"; MAX_INPUTS + 1]})), Some("invalid_request"));
        Ok(())
    }

    #[test]
    fn provider_bodies_and_replies() -> Result<(), String> {
        let request = EmbeddingRequest {
            model: "x".to_string(),
            inputs: vec!["a".to_string(), "b".to_string()],
            dimensions: Some(2),
            base64: false,
            user: None,
        };
        assert_eq!(
            openai_body(&request, "text-embedding-3-small"),
            json!({"model": "text-embedding-3-small", "input": ["a", "b"], "encoding_format": "float", "dimensions": 2})
        );
        assert_eq!(
            gemini_body(&request, "gemini-embedding-001"),
            json!({"requests": [
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "a"}]}, "outputDimensionality": 2},
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "b"}]}, "outputDimensionality": 2}]})
        );
        // Out of order, one of them in base64: placed by index.
        let half = STANDARD.encode([0.5f32, -1.0].iter().flat_map(|value| value.to_le_bytes()).collect::<Vec<u8>>());
        let reply = parse_openai_reply(
            json!({"data": [{"index": 1, "embedding": half}, {"index": 0, "embedding": [0.25, 1]}], "usage": {"prompt_tokens": 2}})
                .to_string()
                .as_bytes(),
            2,
        )?;
        assert_eq!(reply, EmbeddingReply { vectors: vec![vec![0.25, 1.0], vec![0.5, -1.0]], input_tokens: Some(2) });
        assert!(parse_openai_reply(br#"{"data": [{"index": 0, "embedding": [1]}]}"#, 2).is_err(), "an input left unanswered");
        let gemini = parse_gemini_reply(br#"{"embeddings": [{"values": [1, 2]}, {"values": [3, 4]}]}"#, 2)?;
        assert_eq!(gemini, EmbeddingReply { vectors: vec![vec![1.0, 2.0], vec![3.0, 4.0]], input_tokens: None });
        assert!(parse_gemini_reply(br#"{"embeddings": [{"values": [1, 2]}]}"#, 2).is_err());

        let rendered = serde_json::to_value(render_reply(reply.clone(), "openai/text-embedding-3-small", 2, false)).unwrap_or_default();
        assert_eq!(
            rendered,
            json!({"object": "list", "model": "openai/text-embedding-3-small", "usage": {"prompt_tokens": 2, "total_tokens": 2},
                   "data": [{"object": "embedding", "index": 0, "embedding": [0.25, 1.0]}, {"object": "embedding", "index": 1, "embedding": [0.5, -1.0]}]})
        );
        let encoded = serde_json::to_value(render_reply(reply, "m", 2, true)).unwrap_or_default();
        assert_eq!(encoded["data"][1]["embedding"], json!(half));
        Ok(())
    }
}
