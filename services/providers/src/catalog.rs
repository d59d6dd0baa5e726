//! The provider catalog (who can be called, in which wire format, how they authenticate) and the
//! model catalog (prices per million tokens, capabilities, deprecations), with exact cost arithmetic.

use std::collections::BTreeMap;
use std::path::Path;

use brainstorm_common::money::Usd;
use serde::Deserialize;

use crate::chat::Usage;

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFormat {
    OpenAi,
    Anthropic,
    Gemini,
}

impl WireFormat {
    /// As shown in the catalog's `api` field.
    pub fn as_str(self) -> &'static str {
        match self {
            WireFormat::OpenAi => "openai",
            WireFormat::Anthropic => "anthropic",
            WireFormat::Gemini => "gemini",
        }
    }
}

/// How a provider expects its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthStyle {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// `x-api-key: <key>` (Anthropic).
    XApiKey,
    /// `x-goog-api-key: <key>` (Gemini).
    GoogApiKey,
    /// `api-key: <key>` (Azure OpenAI).
    ApiKeyHeader,
    /// No key (a local server).
    None,
}

impl AuthStyle {
    /// As shown in the catalog's `auth` field.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthStyle::Bearer => "bearer",
            AuthStyle::XApiKey => "x-api-key",
            AuthStyle::GoogApiKey => "x-goog-api-key",
            AuthStyle::ApiKeyHeader => "api-key",
            AuthStyle::None => "none",
        }
    }
}

/// A provider in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    pub id: &'static str,
    pub name: &'static str,
    pub format: WireFormat,
    /// Default base URL; `BR_PROVIDER_<ID>_BASE_URL` overrides it.
    pub base_url: &'static str,
    /// The environment variable its own SDKs read the key from.
    pub env_key: &'static str,
    /// Whether its models can be listed live (so models beyond the bundled catalog are accepted).
    pub discoverable: bool,
    pub auth: AuthStyle,
}

const fn provider(
    id: &'static str,
    name: &'static str,
    format: WireFormat,
    base_url: &'static str,
    env_key: &'static str,
    discoverable: bool,
    auth: AuthStyle,
) -> Provider {
    Provider { id, name, format, base_url, env_key, discoverable, auth }
}

/// Every provider Brainstorm can call. Those speaking the OpenAI format share one adapter.
pub const PROVIDERS: [Provider; 14] = [
    provider("openai", "OpenAI", WireFormat::OpenAi, "https://api.openai.com/v1", "OPENAI_API_KEY", false, AuthStyle::Bearer),
    provider("anthropic", "Anthropic", WireFormat::Anthropic, "https://api.anthropic.com", "ANTHROPIC_API_KEY", false, AuthStyle::XApiKey),
    provider(
        "google",
        "Google Gemini",
        WireFormat::Gemini,
        "https://generativelanguage.googleapis.com",
        "GEMINI_API_KEY",
        false,
        AuthStyle::GoogApiKey,
    ),
    provider("mistral", "Mistral AI", WireFormat::OpenAi, "https://api.mistral.ai/v1", "MISTRAL_API_KEY", false, AuthStyle::Bearer),
    provider("groq", "Groq", WireFormat::OpenAi, "https://api.groq.com/openai/v1", "GROQ_API_KEY", false, AuthStyle::Bearer),
    provider("deepseek", "DeepSeek", WireFormat::OpenAi, "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY", false, AuthStyle::Bearer),
    provider("xai", "xAI", WireFormat::OpenAi, "https://api.x.ai/v1", "XAI_API_KEY", false, AuthStyle::Bearer),
    provider("together", "Together AI", WireFormat::OpenAi, "https://api.together.xyz/v1", "TOGETHER_API_KEY", true, AuthStyle::Bearer),
    provider(
        "fireworks",
        "Fireworks AI",
        WireFormat::OpenAi,
        "https://api.fireworks.ai/inference/v1",
        "FIREWORKS_API_KEY",
        true,
        AuthStyle::Bearer,
    ),
    provider("openrouter", "OpenRouter", WireFormat::OpenAi, "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", true, AuthStyle::Bearer),
    provider("cohere", "Cohere", WireFormat::OpenAi, "https://api.cohere.ai/compatibility/v1", "COHERE_API_KEY", false, AuthStyle::Bearer),
    provider("perplexity", "Perplexity", WireFormat::OpenAi, "https://api.perplexity.ai", "PERPLEXITY_API_KEY", false, AuthStyle::Bearer),
    provider(
        "azure-openai",
        "Azure OpenAI",
        WireFormat::OpenAi,
        "https://YOUR-RESOURCE.openai.azure.com/openai/v1",
        "AZURE_OPENAI_API_KEY",
        true,
        AuthStyle::ApiKeyHeader,
    ),
    provider("ollama", "Ollama (local)", WireFormat::OpenAi, "http://127.0.0.1:11434/v1", "OLLAMA_HOST", true, AuthStyle::None),
];

/// The provider with this id.
pub fn provider_by_id(id: &str) -> Option<&'static Provider> {
    PROVIDERS.iter().find(|provider| provider.id == id)
}

/// A provider's base URL after `BR_PROVIDER_<ID>_BASE_URL` overrides.
pub fn base_url<'a>(provider: &'a Provider, overrides: &'a BTreeMap<String, String>) -> &'a str {
    overrides.get(provider.id).map(String::as_str).unwrap_or(provider.base_url)
}

/// Prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Price {
    pub input_per_million: Usd,
    pub output_per_million: Usd,
    /// Prompt tokens read from the provider's cache.
    pub cache_read_per_million: Usd,
    /// Prompt tokens written to the provider's cache for its default time (five minutes).
    pub cache_write_per_million: Usd,
    /// Prompt tokens written to it for an hour.
    pub cache_write_long_per_million: Usd,
}

impl Price {
    /// A price without cache discounts or surcharges: cached tokens cost what input does.
    pub const fn uncached(input_per_million: Usd, output_per_million: Usd) -> Self {
        Price {
            input_per_million,
            output_per_million,
            cache_read_per_million: input_per_million,
            cache_write_per_million: input_per_million,
            cache_write_long_per_million: input_per_million,
        }
    }

    /// The exact cost of `usage`: one rounding (up, to the nano-dollar) on the exact product.
    pub fn cost(&self, usage: Usage) -> Usd {
        let numerator = i128::from(usage.uncached_input_tokens()) * i128::from(self.input_per_million.nanos())
            + i128::from(usage.cache_read_tokens) * i128::from(self.cache_read_per_million.nanos())
            + i128::from(usage.cache_write_tokens.saturating_sub(usage.cache_write_long_tokens))
                * i128::from(self.cache_write_per_million.nanos())
            + i128::from(usage.cache_write_long_tokens.min(usage.cache_write_tokens))
                * i128::from(self.cache_write_long_per_million.nanos())
            + i128::from(usage.output_tokens) * i128::from(self.output_per_million.nanos());
        let nanos = (numerator + 999_999) / 1_000_000;
        Usd::from_nanos(i64::try_from(nanos).unwrap_or(i64::MAX))
    }
}

/// A deprecation notice.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Deprecation {
    /// When the model was deprecated (YYYY-MM-DD).
    pub date: String,
    /// When it stops working (YYYY-MM-DD).
    pub sunset: String,
    pub replacement: Option<String>,
}

/// A model in the catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub provider: String,
    pub model: String,
    pub price: Price,
    pub context: u64,
    pub max_output: u32,
    pub capabilities: Vec<String>,
    /// Static quality prior, 0 to 1 (the learned score replaces it later).
    pub quality: f64,
    /// 1 small, 2 medium, 3 large.
    pub tier: u8,
    pub deprecated: Option<Deprecation>,
}

impl Model {
    /// `provider/model`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }

    /// Whether the model can do `capability` (e.g. `tools`, `vision`).
    pub fn can(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|known| known == capability)
    }
}

#[derive(Deserialize)]
struct CatalogFile {
    models: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    provider: String,
    model: String,
    input: String,
    output: String,
    /// Per million prompt tokens read from the provider's cache; the provider's rule when absent.
    cache_read: Option<String>,
    /// Per million prompt tokens written to it; the provider's rule when absent.
    cache_write: Option<String>,
    /// Per million prompt tokens written to it for an hour; the provider's rule when absent.
    cache_write_long: Option<String>,
    context: u64,
    max_output: u32,
    #[serde(default)]
    capabilities: Vec<String>,
    #[serde(default)]
    quality: f64,
    #[serde(default = "default_tier")]
    tier: u8,
    deprecated: Option<Deprecation>,
}

/// Cache prices per million (reads, five-minute writes, one-hour writes) where the catalog lists
/// none: Anthropic's published rule (a tenth, 1.25 times and twice input); elsewhere what input
/// costs, so a cached token is never priced below what the provider may charge for it.
fn cache_rule(provider: &str, input: Usd) -> (Usd, Usd, Usd) {
    let times = |numerator: i64, denominator: i64| Usd::from_nanos(input.nanos().saturating_mul(numerator) / denominator);
    match provider {
        "anthropic" => (times(1, 10), times(5, 4), times(2, 1)),
        _ => (input, input, input),
    }
}

fn default_tier() -> u8 {
    2
}

/// Why a catalog file was refused.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot read the model catalog {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid model catalog: {0}")]
    Invalid(String),
}

/// The model catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCatalog {
    models: Vec<Model>,
}

const BUNDLED: &str = include_str!("../catalog/models.json");

impl ModelCatalog {
    /// The catalog compiled into the binary.
    pub fn bundled() -> Result<Self, CatalogError> {
        Self::parse(BUNDLED)
    }

    /// A catalog file (the same format as `services/providers/catalog/models.json`).
    pub fn load(path: &Path) -> Result<Self, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    /// Parses and validates a catalog's JSON text.
    pub fn parse(text: &str) -> Result<Self, CatalogError> {
        let file: CatalogFile = serde_json::from_str(text).map_err(|error| CatalogError::Invalid(error.to_string()))?;
        let mut models = Vec::with_capacity(file.models.len());
        for entry in file.models {
            if provider_by_id(&entry.provider).is_none() {
                return Err(CatalogError::Invalid(format!("unknown provider `{}`", entry.provider)));
            }
            let price = |text: &str| {
                Usd::parse_decimal(text).map_err(|error| CatalogError::Invalid(format!("{}/{}: {error}", entry.provider, entry.model)))
            };
            let input = price(&entry.input)?;
            let (read, write, write_long) = cache_rule(&entry.provider, input);
            let price = Price {
                input_per_million: input,
                output_per_million: price(&entry.output)?,
                cache_read_per_million: entry.cache_read.as_deref().map_or(Ok(read), price)?,
                cache_write_per_million: entry.cache_write.as_deref().map_or(Ok(write), price)?,
                cache_write_long_per_million: entry.cache_write_long.as_deref().map_or(Ok(write_long), price)?,
            };
            if [
                price.input_per_million,
                price.output_per_million,
                price.cache_read_per_million,
                price.cache_write_per_million,
                price.cache_write_long_per_million,
            ]
            .iter()
            .any(|price| *price < Usd::ZERO)
            {
                return Err(CatalogError::Invalid(format!("{}/{}: negative price", entry.provider, entry.model)));
            }
            models.push(Model {
                provider: entry.provider,
                model: entry.model,
                price,
                context: entry.context,
                max_output: entry.max_output,
                capabilities: entry.capabilities,
                quality: entry.quality.clamp(0.0, 1.0),
                tier: entry.tier.clamp(1, 3),
                deprecated: entry.deprecated,
            });
        }
        Ok(ModelCatalog { models })
    }

    /// Every model.
    pub fn models(&self) -> &[Model] {
        &self.models
    }

    /// The model `model` of `provider`.
    pub fn find(&self, provider: &str, model: &str) -> Option<&Model> {
        self.models.iter().find(|entry| entry.provider == provider && entry.model == model)
    }

    /// Every provider's entry for a bare model id.
    pub fn by_model_id<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a Model> + 'a {
        self.models.iter().filter(move |entry| entry.model == model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_catalog_covers_the_required_providers() -> Result<(), CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        for id in [
            "openai",
            "anthropic",
            "google",
            "mistral",
            "groq",
            "deepseek",
            "xai",
            "together",
            "fireworks",
            "openrouter",
            "cohere",
            "perplexity",
            "azure-openai",
            "ollama",
        ] {
            assert!(provider_by_id(id).is_some(), "{id} missing from the provider catalog");
            assert!(catalog.models().iter().any(|model| model.provider == id), "{id} has no model");
        }
        Ok(())
    }

    #[test]
    fn costs_are_exact() -> Result<(), CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        let mini = catalog.find("openai", "gpt-4o-mini").map(|model| model.price).unwrap_or_default();
        // 1000 input at $0.15/M + 500 output at $0.60/M = $0.00015 + $0.0003 = $0.00045 exactly.
        assert_eq!(mini.cost(Usage::uncached(1000, 500)), Usd::from_nanos(450_000));
        // One token at $0.15/M is exactly 150 nano-dollars.
        assert_eq!(mini.cost(Usage::uncached(1, 0)), Usd::from_nanos(150));
        // Below a nano-dollar, the exact product is rounded up once.
        let tiny = Price::uncached(Usd::from_nanos(3), Usd::ZERO);
        assert_eq!(tiny.cost(Usage::uncached(1, 0)), Usd::from_nanos(1));
        assert_eq!(tiny.cost(Usage::uncached(1_000_000, 0)), Usd::from_nanos(3));
        assert_eq!(mini.cost(Usage::default()), Usd::ZERO);
        Ok(())
    }

    #[test]
    fn cached_prompt_tokens_are_priced_as_the_provider_prices_them() -> Result<(), CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        let price = |provider: &str, model: &str| catalog.find(provider, model).map(|model| model.price).unwrap_or_default();
        // OpenAI, listed: 600 uncached at $0.15/M + 400 read at $0.075/M + 100 output at $0.60/M.
        let openai = Usage { cache_read_tokens: 400, ..Usage::uncached(1000, 100) };
        assert_eq!(price("openai", "gpt-4o-mini").cost(openai), Usd::from_nanos(90_000 + 30_000 + 60_000));
        // Anthropic's rule ($1/M input): 200 uncached, 600 read at a tenth, 200 written at 1.25 times.
        let anthropic = Usage { cache_read_tokens: 600, cache_write_tokens: 200, ..Usage::uncached(1000, 0) };
        assert_eq!(price("anthropic", "claude-haiku-4-5").cost(anthropic), Usd::from_nanos(200_000 + 60_000 + 250_000));
        // Of those writes, 100 kept an hour: twice input.
        let long = Usage { cache_write_long_tokens: 100, ..anthropic };
        assert_eq!(price("anthropic", "claude-haiku-4-5").cost(long), Usd::from_nanos(200_000 + 60_000 + 125_000 + 200_000));
        // Unlisted elsewhere: a cached token costs what input does (never priced below the provider's bill).
        let gemini = price("google", "gemini-2.5-flash");
        assert_eq!(gemini.cost(Usage { cache_read_tokens: 500, ..Usage::uncached(1000, 0) }), gemini.cost(Usage::uncached(1000, 0)));
        // The catalog's own figures win; counts that do not add up never go below zero.
        let listed = ModelCatalog::parse(
            r#"{"models":[{"provider":"anthropic","model":"m","input":"1","output":"1","cache_read":"0.5","cache_write":"2","context":1,"max_output":1}]}"#,
        )?;
        let listed = listed.find("anthropic", "m").map(|model| model.price).unwrap_or_default();
        assert_eq!(
            (listed.cache_read_per_million, listed.cache_write_per_million),
            (Usd::from_nanos(500_000_000), Usd::from_nanos(2_000_000_000))
        );
        assert_eq!(
            listed.cost(Usage { cache_read_tokens: 10, cache_write_tokens: 10, ..Usage::uncached(5, 0) }),
            Usd::from_nanos(5_000 + 20_000)
        );
        assert!(
            ModelCatalog::parse(
                r#"{"models":[{"provider":"openai","model":"m","input":"1","output":"1","cache_read":"-1","context":1,"max_output":1}]}"#
            )
            .is_err()
        );
        Ok(())
    }

    #[test]
    fn bad_catalogs_are_refused() {
        assert!(
            ModelCatalog::parse(r#"{"models":[{"provider":"nobody","model":"m","input":"1","output":"1","context":1,"max_output":1}]}"#)
                .is_err()
        );
        assert!(
            ModelCatalog::parse(r#"{"models":[{"provider":"openai","model":"m","input":"1e3","output":"1","context":1,"max_output":1}]}"#)
                .is_err()
        );
        assert!(ModelCatalog::parse("not json").is_err());
    }
}
