//! The synthetic `brainstorm/sandbox` model that answers tenants without a provider key.

use brainstorm_providers::chat::{ChatReply, ChatRequest, FinishReason, Part, Usage};
use brainstorm_providers::routing::SANDBOX_MODEL;

/// Rough token count of a text (about four characters a token).
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

/// The sandbox's reply: it says what it is, how to leave the sandbox, and reflects the prompt, so a
/// client can see its request went through the whole pipeline. Honours `max_tokens`.
pub fn sandbox_reply(request: &ChatRequest, id: String) -> ChatReply {
    let last_user = request.last_user_text();
    let words = last_user.split_whitespace().count();
    let excerpt: String = last_user.chars().take(160).collect();
    let ellipsis = if last_user.chars().count() > 160 { "..." } else { "" };
    let full_text = format!(
        "Hello from the Brainstorm sandbox. This reply is simulated by {SANDBOX_MODEL} because no provider key is registered for this tenant; \
         register one with POST /v1/providers to reach {}. Your last message had {words} words: \"{excerpt}{ellipsis}\"",
        request.model
    );
    let (text, finish) = match request.max_tokens {
        Some(limit) if estimate_tokens(&full_text) > u64::from(limit) => {
            let characters = usize::try_from(limit).unwrap_or(usize::MAX).saturating_mul(4);
            (full_text.chars().take(characters).collect(), FinishReason::Length)
        }
        _ => (full_text, FinishReason::Stop),
    };
    let input_tokens =
        (request.prompt_characters() as u64).div_ceil(4) + 3 * (request.messages.len() as u64 + u64::from(request.system.is_some()));
    ChatReply {
        id,
        model: SANDBOX_MODEL.to_string(),
        usage: Usage::uncached(input_tokens, estimate_tokens(&text)),
        parts: vec![Part::Text(text)],
        finish,
        logprobs: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brainstorm_providers::chat::{Message, Role};

    #[test]
    fn the_sandbox_reflects_the_prompt_and_honours_max_tokens() {
        let request = ChatRequest {
            model: "gpt-4o".to_string(),
            messages: vec![Message { role: Role::User, parts: vec![Part::Text("count these four words".to_string())] }],
            ..ChatRequest::default()
        };
        let reply = sandbox_reply(&request, "chatcmpl-1".to_string());
        assert!(reply.text().contains("4 words") && reply.text().contains("count these four words"));
        assert_eq!(reply.finish, FinishReason::Stop);
        assert_eq!(reply.usage.output_tokens, estimate_tokens(&reply.text()));
        let short = sandbox_reply(&ChatRequest { max_tokens: Some(3), ..request }, "chatcmpl-2".to_string());
        assert_eq!((short.finish, short.usage.output_tokens), (FinishReason::Length, 3));
    }
}
