//! Upstream providers: the provider and model catalogs with exact pricing, the neutral chat model,
//! the OpenAI, Anthropic and Gemini wire formats (client side and provider side, streaming included),
//! embeddings, the pooled upstream client, and envelope encryption of provider keys.

pub mod anthropic;
pub mod catalog;
pub mod chat;
pub mod embeddings;
pub mod gemini;
pub mod openai;
pub mod routing;
pub mod sse;
mod typed;
pub mod upstream;
pub mod vault;
