//! Model resolution: from what a request names (`provider/model`, a bare id, an alias, a variant,
//! `@preset/<slug>` or `auto`) to an ordered list of runnable candidates, using only in-memory data.

use std::collections::{BTreeMap, HashMap};

use brainstorm_common::money::Usd;

use crate::catalog::{Model, ModelCatalog, Provider, WireFormat, provider_by_id};
use crate::chat::{ChatRequest, DocumentSource, Usage};

/// Route strategies a request or preset may ask for.
pub const STRATEGIES: [&str; 6] = ["price", "latency", "throughput", "priority", "quality", "cascade"];

/// The synthetic model that answers tenants without provider keys.
pub const SANDBOX_MODEL: &str = "brainstorm/sandbox";

/// Output tokens assumed for an estimate when the request sets no `max_tokens`.
const DEFAULT_OUTPUT_ESTIMATE: u32 = 1024;

/// The `route` object of a request (and a preset's options).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteOptions {
    pub strategy: Option<String>,
    pub models: Vec<String>,
    pub allow_fallback: Option<bool>,
    pub provider_allow: Vec<String>,
    pub provider_deny: Vec<String>,
    pub max_cost_per_request: Option<Usd>,
}

impl RouteOptions {
    /// These options, with `lower`'s values where these have none.
    pub fn over(self, lower: &RouteOptions) -> RouteOptions {
        RouteOptions {
            strategy: self.strategy.or_else(|| lower.strategy.clone()),
            models: if self.models.is_empty() { lower.models.clone() } else { self.models },
            allow_fallback: self.allow_fallback.or(lower.allow_fallback),
            provider_allow: if self.provider_allow.is_empty() { lower.provider_allow.clone() } else { self.provider_allow },
            provider_deny: if self.provider_deny.is_empty() { lower.provider_deny.clone() } else { self.provider_deny },
            max_cost_per_request: self.max_cost_per_request.or(lower.max_cost_per_request),
        }
    }
}

/// A tenant's routing preset.
#[derive(Debug, Clone, PartialEq)]
pub struct PresetSpec {
    pub slug: String,
    pub models: Vec<String>,
    pub strategy: String,
    pub options: RouteOptions,
}

/// What the resolver knows about a tenant.
#[derive(Debug, Clone, Default)]
pub struct TenantRouting {
    /// Providers with an active key, in registration order (the `priority` order).
    pub providers: Vec<String>,
    pub aliases: BTreeMap<String, String>,
    pub presets: Vec<PresetSpec>,
}

impl TenantRouting {
    fn has_key(&self, provider: &str) -> bool {
        self.providers.iter().any(|known| known == provider)
    }
}

/// What one model showed in a tenant's own traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnedModel {
    /// The posterior mean of its success, the catalog's quality as the prior (the leaderboard's reward).
    pub reward: f64,
    /// Mean provider latency of its successes, where measured.
    pub latency_ms: Option<f64>,
    /// Output tokens per second of its successes, where measured.
    pub tokens_per_second: Option<f64>,
}

/// What the gateway learned of a tenant's models, by `provider/model`; empty: the catalog's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Learned {
    models: HashMap<String, LearnedModel>,
}

impl Learned {
    /// Learned figures by `provider/model`.
    pub fn new(models: HashMap<String, LearnedModel>) -> Self {
        Learned { models }
    }

    fn of(&self, candidate: &Candidate) -> Option<&LearnedModel> {
        if self.models.is_empty() {
            return None;
        }
        self.models.get(candidate.id())
    }
}

/// What a resolution weighs beyond the request: the tenant's learned figures, and whether its plan
/// routes cost-first (the sandbox plan does).
#[derive(Debug, Clone, Copy)]
pub struct Signals<'a> {
    pub learned: &'a Learned,
    pub cost_first: bool,
}

impl Signals<'_> {
    /// The candidate's quality: its learned reward, else the catalog's quality.
    fn quality(&self, candidate: &Candidate) -> f64 {
        self.learned.of(candidate).map_or_else(|| candidate.entry.as_ref().map_or(0.0, |entry| entry.quality), |learned| learned.reward)
    }
}

static NOTHING_LEARNED: std::sync::LazyLock<Learned> = std::sync::LazyLock::new(Learned::default);

/// `auto` without a strategy asked for: how much a candidate's cost (relative to the dearest
/// candidate's) and each tier above the one the task needs take off its quality.
const AUTO_COST_WEIGHT: f64 = 0.5;
const AUTO_TIER_WEIGHT: f64 = 0.1;

/// One model to try.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub provider: &'static Provider,
    /// The model id as the provider knows it.
    pub model: String,
    /// The catalog entry (prices, capabilities); None for a discoverable provider's unlisted model.
    pub entry: Option<Model>,
    /// Worst-case cost of this request on this model (None when unpriced).
    pub estimated_cost: Option<Usd>,
    /// `provider/model`, written once: a request reads it about eight times.
    id: String,
}

/// What a request's documents ask of a model: reading files (PDFs), and fetching them by URL.
#[derive(Debug, Clone, Copy)]
struct Files {
    any: bool,
    by_url: bool,
}

impl Files {
    fn of(request: &ChatRequest) -> Self {
        let mut files = Files { any: false, by_url: false };
        for source in request.documents() {
            match source {
                DocumentSource::Base64 { .. } => files.any = true,
                DocumentSource::Url(_) => (files.any, files.by_url) = (true, true),
                // Plain text any chat model reads.
                DocumentSource::Text(_) => {}
            }
        }
        files
    }
}

/// Whether a candidate can read the request's files: a catalog model with the `documents`
/// capability (an unlisted one is given the benefit of the doubt, as for images), and one outside
/// OpenAI's format for a file by URL (OpenAI's chat API takes file data only).
fn can_read(candidate: &Candidate, files: Files) -> bool {
    candidate.entry.as_ref().is_none_or(|entry| entry.can("documents"))
        && !(files.by_url && candidate.provider.format == WireFormat::OpenAi)
}

impl Candidate {
    /// `provider/model`.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// How the model was chosen (`X-BR-Selection-Method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectionMethod {
    Explicit,
    Alias,
    Preset,
    Variant,
    CapabilityMatched,
}

impl SelectionMethod {
    /// As the header shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            SelectionMethod::Explicit => "explicit",
            SelectionMethod::Alias => "alias",
            SelectionMethod::Preset => "preset",
            SelectionMethod::Variant => "variant",
            SelectionMethod::CapabilityMatched => "capability-matched",
        }
    }
}

/// The outcome of resolution.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// No provider key: the sandbox model answers.
    Sandbox,
    /// Candidates in the order to try them.
    Route(Route),
}

/// An ordered candidate list and how it was reached.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    pub candidates: Vec<Candidate>,
    pub method: SelectionMethod,
    pub strategy: String,
    pub reason: String,
    /// For `auto`: the complexity tier (1-3) and score (0-10) the prompt was judged to need.
    pub complexity: Option<(u8, u8)>,
    /// Whether to try later candidates when one fails.
    pub allow_fallback: bool,
    /// The request's estimated input tokens, measured once for every estimate of it (`usage`).
    pub input_tokens: u64,
    /// For `auto` ordered by score: how sure the pick was, why, and what it saved.
    pub selection: Option<Selection>,
}

/// How `auto` chose its first candidate, for `X-BR-Selection-Confidence`, `-Selection-Reason` and
/// `X-BR-Routing-Savings`.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// 0.5 when the first two candidates' scores tie, rising with the first's lead to 1 at a lead of
    /// 0.5 or more (1 for the only candidate).
    pub confidence: f64,
    /// The first candidate's score in its parts, and the next candidate's.
    pub reason: String,
    /// The dearest candidate's estimate less the first's: what choosing by score saved against the
    /// dearest capable model (None when either is unpriced or nothing was saved).
    pub savings: Option<Usd>,
}

impl Route {
    /// Estimated token usage of the routed request (`request`) on a model, as `estimate_usage`.
    pub fn usage(&self, request: &ChatRequest, entry: Option<&Model>) -> Usage {
        usage_on(self.input_tokens, request, entry)
    }
}

/// Why no route exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("model `{0}` is not in the catalog")]
    ModelNotFound(String),
    #[error("`{model}` needs a {provider} key: register one with POST /v1/providers")]
    ByokRequired { provider: String, model: String },
    #[error("no runnable model satisfies the request: {0}")]
    NoRunnableModel(String),
    #[error("preset `{0}` does not exist")]
    PresetNotFound(String),
}

/// The candidates for an embeddings request naming `requested` (`provider/model`, a bare id or an
/// alias; no presets or `auto`): catalog models with the `embeddings` capability, or a discoverable
/// provider's unlisted model where its format has embeddings (OpenAI's, Gemini's), each priced for
/// `input_tokens`. A tenant without provider keys gets `ByokRequired` (there is no sandbox embedder).
pub fn resolve_embeddings(
    requested: &str,
    tenant: &TenantRouting,
    catalog: &ModelCatalog,
    input_tokens: u64,
) -> Result<Vec<Candidate>, RouteError> {
    let spec = tenant.aliases.get(requested).map_or(requested, String::as_str);
    if tenant.providers.is_empty() {
        let provider = spec.split_once('/').map_or("openai", |(provider, _)| provider);
        return Err(RouteError::ByokRequired { provider: provider.to_string(), model: spec.to_string() });
    }
    let nothing = ChatRequest::default();
    let pricing = Pricing { request: &nothing, input_tokens };
    let mut candidates = resolve_spec(spec, tenant, catalog, &pricing)?;
    candidates.retain(|candidate| match &candidate.entry {
        Some(entry) => entry.can("embeddings"),
        None => candidate.provider.format != WireFormat::Anthropic,
    });
    for candidate in &mut candidates {
        candidate.estimated_cost = candidate.entry.as_ref().map(|entry| entry.price.cost(Usage::uncached(input_tokens, 0)));
    }
    if candidates.is_empty() {
        return Err(RouteError::NoRunnableModel(format!("`{spec}` is not an embedding model")));
    }
    Ok(candidates)
}

/// Estimated token usage of a request on a model.
pub fn estimate_usage(request: &ChatRequest, entry: Option<&Model>) -> Usage {
    Pricing::of(request).usage(entry)
}

/// A request as the estimates read it, its input measured once: counting its prompt walks every
/// message and serializes every tool schema, and a resolution prices each candidate (`auto`, every
/// capable model of the catalog), then hands the measure on in its `Route`.
struct Pricing<'a> {
    request: &'a ChatRequest,
    input_tokens: u64,
}

impl<'a> Pricing<'a> {
    fn of(request: &'a ChatRequest) -> Self {
        Pricing { request, input_tokens: (request.prompt_characters() as u64).div_ceil(4) + 4 * request.messages.len() as u64 }
    }

    fn usage(&self, entry: Option<&Model>) -> Usage {
        usage_on(self.input_tokens, self.request, entry)
    }
}

/// `input_tokens` and the request's output budget (or the model's, capped) on a model.
fn usage_on(input_tokens: u64, request: &ChatRequest, entry: Option<&Model>) -> Usage {
    let max_output = entry.map_or(DEFAULT_OUTPUT_ESTIMATE, |entry| entry.max_output.min(DEFAULT_OUTPUT_ESTIMATE));
    Usage::uncached(input_tokens, u64::from(request.max_tokens.unwrap_or(max_output)))
}

fn candidate(provider: &'static Provider, model: &str, catalog: &ModelCatalog, pricing: &Pricing<'_>) -> Candidate {
    let entry = catalog.find(provider.id, model).cloned();
    let estimated_cost = entry.as_ref().map(|entry| entry.price.cost(pricing.usage(Some(entry))));
    Candidate { provider, model: model.to_string(), entry, estimated_cost, id: [provider.id, "/", model].concat() }
}

/// Splits a `:floor|:fast|:best|:smart` suffix into the base id and its strategy.
pub fn split_variant(model: &str) -> (&str, Option<&'static str>) {
    let Some((base, suffix)) = model.rsplit_once(':') else { return (model, None) };
    let strategy = match suffix {
        "floor" => "price",
        "fast" => "latency",
        "best" => "quality",
        "smart" => "smart",
        _ => return (model, None),
    };
    (base, Some(strategy))
}

/// Candidates for one model spec (no presets, no `auto`): explicit `provider/model` or a bare id.
fn resolve_spec(spec: &str, tenant: &TenantRouting, catalog: &ModelCatalog, pricing: &Pricing<'_>) -> Result<Vec<Candidate>, RouteError> {
    if let Some((provider, model)) =
        spec.split_once('/').and_then(|(provider_id, model)| provider_by_id(provider_id).map(|provider| (provider, model)))
    {
        if !tenant.has_key(provider.id) {
            return Err(RouteError::ByokRequired { provider: provider.id.to_string(), model: spec.to_string() });
        }
        if catalog.find(provider.id, model).is_some() || provider.discoverable {
            return Ok(vec![candidate(provider, model, catalog, pricing)]);
        }
        return Err(RouteError::ModelNotFound(spec.to_string()));
    }
    let entries: Vec<&Model> = catalog.by_model_id(spec).collect();
    let runnable: Vec<Candidate> = entries
        .iter()
        .filter(|entry| tenant.has_key(&entry.provider))
        .filter_map(|entry| provider_by_id(&entry.provider).map(|provider| candidate(provider, &entry.model, catalog, pricing)))
        .collect();
    match (runnable.is_empty(), entries.first()) {
        (false, _) => Ok(runnable),
        (true, Some(entry)) => Err(RouteError::ByokRequired { provider: entry.provider.clone(), model: entry.id() }),
        (true, None) => Err(RouteError::ModelNotFound(spec.to_string())),
    }
}

/// The complexity tier (1-3) and score (0-10) `auto` judges a request to need.
pub fn complexity(request: &ChatRequest) -> (u8, u8) {
    let characters = request.prompt_characters();
    let last = request.last_user_text().to_lowercase();
    let mut score: u32 = match characters {
        0..=1_999 => 2,
        2_000..=19_999 => 5,
        _ => 8,
    };
    let demanding = ["step by step", "prove", "analy", "```", "refactor", "architecture", "reason"];
    if demanding.iter().any(|marker| last.contains(marker)) {
        score += 2;
    }
    if !request.tools.is_empty() {
        score += 1;
    }
    let score = score.min(10) as u8;
    let tier = match score {
        0..=3 => 1,
        4..=6 => 2,
        _ => 3,
    };
    (tier, score)
}

/// Resolves what a request names into candidates, in the order to try them.
///
/// `auto` rule: judge the tier the prompt needs (`complexity`), keep the
/// tenant's catalog models that have the needed capabilities (tools, vision), are not deprecated and are
/// at or above that tier, scored by quality less cost and tier distance (cheapest first on a
/// cost-first plan). This is [`resolve_with`] on the catalog's figures alone, not cost-first.
pub fn resolve(
    requested: &str,
    tenant: &TenantRouting,
    catalog: &ModelCatalog,
    request: &ChatRequest,
    route: &RouteOptions,
) -> Result<Resolution, RouteError> {
    resolve_with(requested, tenant, catalog, request, route, Signals { learned: &NOTHING_LEARNED, cost_first: false })
}

/// [`resolve`] weighing `signals`: without `route.strategy`, a requested model's candidates are
/// ordered by `quality` (the learned reward where the tenant's traffic measured it), as the spec's
/// default has it, or by `price` on a cost-first plan; `latency` and `throughput` order by what was
/// measured before the tier proxies.
pub fn resolve_with(
    requested: &str,
    tenant: &TenantRouting,
    catalog: &ModelCatalog,
    request: &ChatRequest,
    route: &RouteOptions,
    signals: Signals<'_>,
) -> Result<Resolution, RouteError> {
    if requested == SANDBOX_MODEL || tenant.providers.is_empty() {
        return Ok(Resolution::Sandbox);
    }
    let pricing = Pricing::of(request);
    // The spec's default is `quality`; a cost-first plan (the sandbox) defaults to `price`.
    let by_default = if signals.cost_first { "price" } else { "quality" };
    let mut options = route.clone();
    let mut complexity_seen = None;
    // `auto`'s cost scale (see `auto_order`), when it ordered by score.
    let mut auto_dearest = None;
    let (mut candidates, method, default_strategy, reason) = if requested == "auto" {
        let (tier, score) = complexity(request);
        complexity_seen = Some((tier, score));
        let candidates: Vec<Candidate> = catalog
            .models()
            .iter()
            .filter(|entry| tenant.has_key(&entry.provider) && entry.can("chat") && entry.deprecated.is_none() && entry.tier >= tier)
            .filter_map(|entry| provider_by_id(&entry.provider).map(|provider| candidate(provider, &entry.model, catalog, &pricing)))
            .collect();
        let how = if signals.cost_first { "cheapest capable model first (cost-first plan)" } else { "quality less cost and tier distance" };
        (candidates, SelectionMethod::CapabilityMatched, by_default, format!("auto: complexity tier {tier}, {how}"))
    } else if let Some(slug) = requested.strip_prefix("@preset/") {
        let preset =
            tenant.presets.iter().find(|preset| preset.slug == slug).ok_or_else(|| RouteError::PresetNotFound(slug.to_string()))?;
        options = options.over(&preset.options);
        options.strategy = options.strategy.or_else(|| Some(preset.strategy.clone()));
        let mut candidates = Vec::new();
        let mut last_error = None;
        for spec in &preset.models {
            let spec = tenant.aliases.get(spec).map_or(spec.as_str(), String::as_str);
            match resolve_spec(spec, tenant, catalog, &pricing) {
                Ok(found) => candidates.extend(found),
                Err(error) => last_error = Some(error),
            }
        }
        if candidates.is_empty() {
            return Err(last_error.unwrap_or_else(|| RouteError::NoRunnableModel(format!("preset `{slug}` lists no runnable model"))));
        }
        (candidates, SelectionMethod::Preset, "cascade", format!("preset {slug}"))
    } else if let Some(target) = tenant.aliases.get(requested) {
        let (base, variant) = split_variant(target);
        if let Some(strategy) = variant {
            options.strategy = options.strategy.or_else(|| Some(strategy.to_string()));
        }
        (resolve_spec(base, tenant, catalog, &pricing)?, SelectionMethod::Alias, by_default, format!("alias {requested} -> {target}"))
    } else {
        let (base, variant) = split_variant(requested);
        let method = if variant.is_some() { SelectionMethod::Variant } else { SelectionMethod::Explicit };
        if let Some(strategy) = variant {
            options.strategy = Some(strategy.to_string());
        }
        (resolve_spec(base, tenant, catalog, &pricing)?, method, by_default, "requested model".to_string())
    };

    // Without a strategy asked for, the requested model's own candidates are ordered by the default
    // strategy and the fallback models follow in the order they were listed; an explicit strategy
    // orders them all.
    let explicit_strategy = options.strategy.is_some();
    let strategy = options.strategy.clone().unwrap_or_else(|| default_strategy.to_string());
    if !explicit_strategy {
        match complexity_seen {
            Some((tier, _)) if strategy == "quality" => auto_dearest = Some(auto_order(&mut candidates, tier, tenant, signals)),
            _ => order(&mut candidates, &strategy, tenant, signals),
        }
    }
    for spec in &options.models {
        let spec = tenant.aliases.get(spec).map_or(spec.as_str(), String::as_str);
        if let Ok(found) = resolve_spec(spec, tenant, catalog, &pricing) {
            candidates.extend(found);
        }
    }
    let mut seen = std::collections::HashSet::new();
    candidates.retain(|candidate| seen.insert(candidate.id().to_string()));

    let before = candidates.len();
    if !options.provider_allow.is_empty() {
        candidates.retain(|candidate| options.provider_allow.iter().any(|allowed| allowed == candidate.provider.id));
    }
    candidates.retain(|candidate| !options.provider_deny.iter().any(|denied| denied == candidate.provider.id));
    if let Some(ceiling) = options.max_cost_per_request {
        candidates.retain(|candidate| candidate.estimated_cost.is_none_or(|cost| cost <= ceiling));
    }
    // Embedding models answer no conversation.
    candidates.retain(|candidate| candidate.entry.as_ref().is_none_or(|entry| entry.can("chat")));
    if !request.tools.is_empty() {
        candidates.retain(|candidate| candidate.entry.as_ref().is_none_or(|entry| entry.can("tools")));
    }
    if request.has_images() {
        candidates.retain(|candidate| candidate.entry.as_ref().is_none_or(|entry| entry.can("vision")));
    }
    let files = Files::of(request);
    if files.any {
        candidates.retain(|candidate| can_read(candidate, files));
    }
    if candidates.is_empty() {
        let why = if before == 0 {
            "no candidate model"
        } else {
            "every candidate was filtered out by providerAllow/providerDeny, maxCostPerRequest or capabilities"
        };
        return Err(RouteError::NoRunnableModel(why.to_string()));
    }

    if explicit_strategy {
        order(&mut candidates, &strategy, tenant, signals);
    }
    let selection = match (complexity_seen, auto_dearest) {
        (Some((tier, _)), Some(dearest)) => Some(auto_selection(&candidates, tier, dearest, signals)),
        // `auto` ordered by a rule (a strategy asked for, a cost-first plan's price): its first is
        // certain by that rule.
        (Some(_), None) => Some(ruled_selection(&candidates, &strategy)),
        _ => None,
    };
    Ok(Resolution::Route(Route {
        candidates,
        method,
        strategy,
        reason,
        complexity: complexity_seen,
        allow_fallback: options.allow_fallback.unwrap_or(true),
        input_tokens: pricing.input_tokens,
        selection,
    }))
}

fn cost_key(candidate: &Candidate) -> i64 {
    candidate.estimated_cost.map_or(i64::MAX, Usd::nanos)
}

fn tier(candidate: &Candidate) -> u8 {
    candidate.entry.as_ref().map_or(3, |entry| entry.tier)
}

/// `auto`'s order: quality less [`AUTO_COST_WEIGHT`] times the cost relative to the dearest
/// candidate's (unpriced counts as the dearest) and [`AUTO_TIER_WEIGHT`] per tier above `needed`.
/// Returns the cost scale it used (the dearest estimate in nano-dollars).
fn auto_order(candidates: &mut [Candidate], needed: u8, tenant: &TenantRouting, signals: Signals<'_>) -> f64 {
    let dearest = candidates.iter().filter_map(|candidate| candidate.estimated_cost).map(Usd::nanos).max().unwrap_or(0).max(1) as f64;
    let score = |candidate: &Candidate| AutoScore::of(candidate, needed, dearest, signals).total();
    candidates
        .sort_by(|a, b| score(b).total_cmp(&score(a)).then(cost_key(a).cmp(&cost_key(b))).then(rank(tenant, a).cmp(&rank(tenant, b))));
    dearest
}

/// A candidate's `auto` score in its parts.
struct AutoScore {
    quality: f64,
    /// The cost term: [`AUTO_COST_WEIGHT`] times the cost relative to the dearest.
    cost: f64,
    /// The tier term: [`AUTO_TIER_WEIGHT`] per tier above the one needed.
    distance: f64,
}

impl AutoScore {
    fn of(candidate: &Candidate, needed: u8, dearest: f64, signals: Signals<'_>) -> AutoScore {
        let cost = candidate.estimated_cost.map_or(dearest, |cost| cost.nanos() as f64);
        AutoScore {
            quality: signals.quality(candidate),
            cost: AUTO_COST_WEIGHT * cost / dearest,
            distance: AUTO_TIER_WEIGHT * f64::from(tier(candidate).saturating_sub(needed)),
        }
    }

    fn total(&self) -> f64 {
        self.quality - self.cost - self.distance
    }
}

/// The first candidate's estimate below the dearest's (None when either is unpriced or it is the dearest).
fn savings_of(candidates: &[Candidate]) -> Option<Usd> {
    let dearest = candidates.iter().filter_map(|candidate| candidate.estimated_cost).max()?;
    let chosen = candidates.first()?.estimated_cost?;
    (dearest > chosen).then(|| Usd::from_nanos(dearest.nanos() - chosen.nanos()))
}

/// `auto`'s pick when `strategy` ordered the candidates: certain by that rule.
fn ruled_selection(candidates: &[Candidate], strategy: &str) -> Selection {
    let reason = match candidates.first() {
        Some(first) => format!("{}: first by {strategy} of {} capable models", first.id(), candidates.len()),
        None => String::new(),
    };
    Selection { confidence: 1.0, reason, savings: savings_of(candidates) }
}

/// How sure `auto` was of the first of `candidates` (in their final order), and what it saved.
fn auto_selection(candidates: &[Candidate], needed: u8, dearest: f64, signals: Signals<'_>) -> Selection {
    let score = |candidate: &Candidate| AutoScore::of(candidate, needed, dearest, signals);
    let Some(first) = candidates.first() else {
        return Selection { confidence: 0.0, reason: String::new(), savings: None };
    };
    let best = score(first);
    let mut reason = format!(
        "{}: quality {:.2} less cost {:.2} and tier distance {:.2} = {:.2}",
        first.id(),
        best.quality,
        best.cost,
        best.distance,
        best.total()
    );
    let confidence = match candidates.get(1) {
        Some(next) => {
            let next_total = score(next).total();
            reason.push_str(&format!("; next {} = {next_total:.2}", next.id()));
            0.5 + (best.total() - next_total).clamp(0.0, 0.5)
        }
        None => {
            reason.push_str("; the only capable model");
            1.0
        }
    };
    Selection { confidence, reason, savings: savings_of(candidates) }
}

/// The candidate's provider's place in the tenant's order (`priority`; the last tie-breaker of the others).
fn rank(tenant: &TenantRouting, candidate: &Candidate) -> usize {
    tenant.providers.iter().position(|provider| provider == candidate.provider.id).unwrap_or(usize::MAX)
}

/// Orders candidates by strategy. `latency` and `throughput` put the models the tenant's traffic
/// measured first (lowest mean latency, highest output tokens per second), then the rest by tier
/// (smaller answers faster) and price as proxies.
fn order(candidates: &mut [Candidate], strategy: &str, tenant: &TenantRouting, signals: Signals<'_>) {
    let quality = |candidate: &Candidate| signals.quality(candidate);
    let measured = |candidate: &Candidate, figure: fn(&LearnedModel) -> Option<f64>| signals.learned.of(candidate).and_then(figure);
    let unmeasured_last = |a: Option<f64>, b: Option<f64>, lower_first: bool| match (a, b) {
        (Some(a), Some(b)) if lower_first => a.total_cmp(&b),
        (Some(a), Some(b)) => b.total_cmp(&a),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    };
    match strategy {
        "price" => candidates.sort_by(|a, b| {
            cost_key(a).cmp(&cost_key(b)).then(quality(b).total_cmp(&quality(a))).then(rank(tenant, a).cmp(&rank(tenant, b)))
        }),
        "quality" => candidates.sort_by(|a, b| {
            quality(b).total_cmp(&quality(a)).then(cost_key(a).cmp(&cost_key(b))).then(rank(tenant, a).cmp(&rank(tenant, b)))
        }),
        "latency" => candidates.sort_by(|a, b| {
            unmeasured_last(measured(a, |learned| learned.latency_ms), measured(b, |learned| learned.latency_ms), true)
                .then(tier(a).cmp(&tier(b)))
                .then(cost_key(a).cmp(&cost_key(b)))
        }),
        "throughput" => candidates.sort_by(|a, b| {
            unmeasured_last(measured(a, |learned| learned.tokens_per_second), measured(b, |learned| learned.tokens_per_second), false)
                .then(tier(a).cmp(&tier(b)))
                .then(cost_key(a).cmp(&cost_key(b)))
        }),
        "priority" => candidates.sort_by_key(|candidate| rank(tenant, candidate)),
        "smart" => {
            // A quality-weighted draw picks the first endpoint; the rest follow by quality.
            candidates.sort_by(|a, b| quality(b).total_cmp(&quality(a)));
            let total: f64 = candidates.iter().map(|candidate| quality(candidate).max(0.01)).sum();
            let mut draw = rand::random::<f64>() * total;
            let mut chosen = 0;
            for (index, candidate) in candidates.iter().enumerate() {
                draw -= quality(candidate).max(0.01);
                if draw <= 0.0 {
                    chosen = index;
                    break;
                }
            }
            candidates[..=chosen].rotate_right(1);
        }
        // `cascade` keeps the listed order.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{Message, Part, Role, Tool};

    fn request(text: &str) -> ChatRequest {
        ChatRequest { messages: vec![Message { role: Role::User, parts: vec![Part::Text(text.to_string())] }], ..ChatRequest::default() }
    }

    fn tenant(providers: &[&str]) -> TenantRouting {
        TenantRouting { providers: providers.iter().map(|provider| provider.to_string()).collect(), ..TenantRouting::default() }
    }

    fn ids(resolution: Result<Resolution, RouteError>) -> Vec<String> {
        match resolution {
            Ok(Resolution::Route(route)) => route.candidates.iter().map(|candidate| candidate.id().to_string()).collect(),
            other => vec![format!("{other:?}")],
        }
    }

    #[test]
    fn no_keys_means_sandbox_and_explicit_models_need_their_key() -> Result<(), crate::catalog::CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        let none = TenantRouting::default();
        assert_eq!(resolve("openai/gpt-4o", &none, &catalog, &request("hi"), &RouteOptions::default()), Ok(Resolution::Sandbox));
        let anthropic_only = tenant(&["anthropic"]);
        assert_eq!(
            resolve("openai/gpt-4o", &anthropic_only, &catalog, &request("hi"), &RouteOptions::default()),
            Err(RouteError::ByokRequired { provider: "openai".to_string(), model: "openai/gpt-4o".to_string() })
        );
        assert_eq!(
            ids(resolve("anthropic/claude-haiku-4-5", &anthropic_only, &catalog, &request("hi"), &RouteOptions::default())),
            vec!["anthropic/claude-haiku-4-5"]
        );
        assert_eq!(
            resolve("anthropic/claude-nonexistent", &anthropic_only, &catalog, &request("hi"), &RouteOptions::default()),
            Err(RouteError::ModelNotFound("anthropic/claude-nonexistent".to_string()))
        );
        assert_eq!(
            resolve("no-such-model", &anthropic_only, &catalog, &request("hi"), &RouteOptions::default()),
            Err(RouteError::ModelNotFound("no-such-model".to_string()))
        );
        Ok(())
    }

    #[test]
    fn bare_ids_aliases_variants_and_fallbacks() -> Result<(), crate::catalog::CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        let mut both = tenant(&["azure-openai", "openai", "anthropic"]);
        // A bare id served by two providers: quality by default, the same model's tie broken by price
        // and then by registration order.
        assert_eq!(
            ids(resolve("gpt-4o-mini", &both, &catalog, &request("hi"), &RouteOptions::default())),
            vec!["azure-openai/gpt-4o-mini", "openai/gpt-4o-mini"]
        );
        // What the tenant's traffic measured decides: the learned reward for quality, the measured
        // latency and throughput for theirs; `priority` keeps registration order whatever was learned.
        let figures = |reward, latency_ms, tokens_per_second| LearnedModel { reward, latency_ms, tokens_per_second };
        let learned = Learned::new(
            [
                ("azure-openai/gpt-4o-mini".to_string(), figures(0.3, Some(900.0), Some(20.0))),
                ("openai/gpt-4o-mini".to_string(), figures(0.9, Some(300.0), Some(80.0))),
            ]
            .into_iter()
            .collect(),
        );
        let signals = Signals { learned: &learned, cost_first: false };
        let with = |strategy: Option<&str>| {
            let options = RouteOptions { strategy: strategy.map(str::to_string), ..RouteOptions::default() };
            ids(resolve_with("gpt-4o-mini", &both, &catalog, &request("hi"), &options, signals))
        };
        for strategy in [None, Some("quality"), Some("latency"), Some("throughput")] {
            assert_eq!(with(strategy), vec!["openai/gpt-4o-mini", "azure-openai/gpt-4o-mini"], "{strategy:?}");
        }
        assert_eq!(with(Some("priority")), vec!["azure-openai/gpt-4o-mini", "openai/gpt-4o-mini"]);
        assert!(
            matches!(resolve_with("gpt-4o-mini", &both, &catalog, &request("hi"), &RouteOptions::default(), signals), Ok(Resolution::Route(route)) if route.strategy == "quality")
        );
        both.aliases.insert("fast".to_string(), "anthropic/claude-haiku-4-5".to_string());
        let aliased = resolve("fast", &both, &catalog, &request("hi"), &RouteOptions::default());
        assert!(matches!(&aliased, Ok(Resolution::Route(route)) if route.method == SelectionMethod::Alias));
        let route = RouteOptions { models: vec!["openai/gpt-4o".to_string()], ..RouteOptions::default() };
        assert_eq!(ids(resolve("fast", &both, &catalog, &request("hi"), &route)), vec!["anthropic/claude-haiku-4-5", "openai/gpt-4o"]);
        let no_fallback = RouteOptions { allow_fallback: Some(false), ..route.clone() };
        assert!(
            matches!(resolve("fast", &both, &catalog, &request("hi"), &no_fallback), Ok(Resolution::Route(route)) if !route.allow_fallback)
        );
        let denied = RouteOptions { provider_deny: vec!["anthropic".to_string()], ..route };
        assert_eq!(ids(resolve("fast", &both, &catalog, &request("hi"), &denied)), vec!["openai/gpt-4o"]);
        let (base, strategy) = split_variant("gpt-4o-mini:floor");
        assert_eq!((base, strategy), ("gpt-4o-mini", Some("price")));
        assert_eq!(split_variant("llama3.2:latest"), ("llama3.2:latest", None));
        Ok(())
    }

    #[test]
    fn presets_cost_ceilings_and_auto() -> Result<(), crate::catalog::CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        let mut keys = tenant(&["openai", "anthropic"]);
        keys.presets.push(PresetSpec {
            slug: "cheap".to_string(),
            models: vec!["anthropic/claude-opus-4-5".to_string(), "openai/gpt-4o-mini".to_string()],
            strategy: "price".to_string(),
            options: RouteOptions::default(),
        });
        assert_eq!(
            ids(resolve("@preset/cheap", &keys, &catalog, &request("hi"), &RouteOptions::default())),
            vec!["openai/gpt-4o-mini", "anthropic/claude-opus-4-5"]
        );
        assert_eq!(
            resolve("@preset/missing", &keys, &catalog, &request("hi"), &RouteOptions::default()),
            Err(RouteError::PresetNotFound("missing".to_string()))
        );
        let ceiling = RouteOptions { max_cost_per_request: Some(Usd::from_nanos(1_000_000)), ..RouteOptions::default() };
        assert!(matches!(
            resolve("anthropic/claude-opus-4-5", &keys, &catalog, &request("hi"), &ceiling),
            Err(RouteError::NoRunnableModel(_))
        ));
        // auto on a cost-first plan (sandbox) picks the cheapest capable model at or above the needed tier.
        let nothing = Learned::default();
        let sandbox = Signals { learned: &nothing, cost_first: true };
        let simple = resolve_with("auto", &keys, &catalog, &request("what is 2+2?"), &RouteOptions::default(), sandbox);
        assert_eq!(ids(simple).first().map(String::as_str), Some("openai/gpt-4.1-nano"));
        // Elsewhere it weighs quality against cost and tier distance: the cheapest model is not
        // always the pick, and what the tenant's traffic taught moves it.
        let simple = resolve("auto", &keys, &catalog, &request("what is 2+2?"), &RouteOptions::default());
        let first = ids(simple.clone()).first().cloned().unwrap_or_default();
        assert!(matches!(&simple, Ok(Resolution::Route(route)) if route.strategy == "quality"), "{simple:?}");
        let failing = LearnedModel { reward: 0.05, latency_ms: None, tokens_per_second: None };
        let learned = Learned::new([(first.clone(), failing)].into_iter().collect());
        let taught = resolve_with(
            "auto",
            &keys,
            &catalog,
            &request("what is 2+2?"),
            &RouteOptions::default(),
            Signals { learned: &learned, cost_first: false },
        );
        assert_ne!(ids(taught).first(), Some(&first), "a model that keeps failing loses its place");
        let hard = request(&format!("prove step by step {}", "x".repeat(25_000)));
        let hard_route = resolve("auto", &keys, &catalog, &hard, &RouteOptions::default());
        assert!(
            matches!(&hard_route, Ok(Resolution::Route(route)) if route.candidates.iter().all(|candidate| candidate.entry.as_ref().is_some_and(|entry| entry.tier == 3)))
        );
        let mut with_tools = request("hi");
        with_tools.tools.push(Tool { name: "t".to_string(), description: None, parameters: serde_json::json!({}).into() });
        assert!(
            matches!(resolve("auto", &keys, &catalog, &with_tools, &RouteOptions::default()), Ok(Resolution::Route(route)) if route.candidates.iter().all(|candidate| candidate.entry.as_ref().is_some_and(|entry| entry.can("tools"))))
        );
        Ok(())
    }

    #[test]
    fn auto_says_how_sure_it_was_and_what_it_saved() -> Result<(), crate::catalog::CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        let keys = tenant(&["openai", "anthropic"]);
        let Ok(Resolution::Route(route)) = resolve("auto", &keys, &catalog, &request("what is 2+2?"), &RouteOptions::default()) else {
            panic!("auto resolves");
        };
        let selection = route.selection.clone().unwrap_or_else(|| panic!("auto by quality has a selection"));
        assert!((0.5..=1.0).contains(&selection.confidence), "{selection:?}");
        let (first, next) = (&route.candidates[0], &route.candidates[1]);
        assert!(selection.reason.starts_with(&format!("{}: quality ", first.id())), "{selection:?}");
        assert!(selection.reason.contains(&format!("; next {} = ", next.id())), "{selection:?}");
        let dearest = route.candidates.iter().filter_map(|candidate| candidate.estimated_cost).max();
        let chosen = first.estimated_cost;
        assert_eq!(selection.savings.map(Usd::nanos), dearest.zip(chosen).map(|(dearest, chosen)| dearest.nanos() - chosen.nanos()));
        assert!(selection.savings.is_some_and(|savings| savings > Usd::ZERO), "the pick is not the dearest: {selection:?}");
        // The confidence follows the lead: two equal scores are a coin toss, a lone model certain.
        let learned = Learned::default();
        let signals = Signals { learned: &learned, cost_first: false };
        let twin = route.candidates[..1].iter().chain(route.candidates[..1].iter()).cloned().collect::<Vec<_>>();
        assert_eq!(auto_selection(&twin, 1, 1.0, signals).confidence, 0.5);
        let alone = auto_selection(&route.candidates[..1], 1, 1.0, signals);
        assert_eq!((alone.confidence, alone.savings), (1.0, None));
        assert!(alone.reason.ends_with("; the only capable model"), "{alone:?}");
        // A strategy asked for (or a cost-first plan) orders by its rule: certain, and the cheapest
        // saves the most. A named model: the caller chose, no selection.
        let by_price = RouteOptions { strategy: Some("price".to_string()), ..RouteOptions::default() };
        let Ok(Resolution::Route(cheapest)) = resolve("auto", &keys, &catalog, &request("hi"), &by_price) else { panic!("auto resolves") };
        let ruled = cheapest.selection.clone().unwrap_or_else(|| panic!("auto by price has a selection"));
        assert_eq!(ruled.confidence, 1.0);
        assert!(ruled.reason.starts_with(&format!("{}: first by price of ", cheapest.candidates[0].id())), "{ruled:?}");
        assert!(ruled.savings >= selection.savings, "{ruled:?} {selection:?}");
        let named = resolve("openai/gpt-4o", &keys, &catalog, &request("hi"), &RouteOptions::default());
        assert!(matches!(named, Ok(Resolution::Route(route)) if route.selection.is_none()));
        Ok(())
    }

    #[test]
    fn embeddings_resolve_to_embedding_models_and_chat_never_does() -> Result<(), crate::catalog::CatalogError> {
        let catalog = ModelCatalog::bundled()?;
        let mut keys = tenant(&["openai", "anthropic", "google"]);
        keys.aliases.insert("vectors".to_string(), "google/gemini-embedding-001".to_string());
        let ids = |found: Result<Vec<Candidate>, RouteError>| match found {
            Ok(candidates) => candidates.iter().map(|candidate| candidate.id().to_string()).collect(),
            Err(error) => vec![format!("{error:?}")],
        };
        let small = resolve_embeddings("text-embedding-3-small", &keys, &catalog, 1_000_000);
        // One million tokens at the catalog's $0.02 per million.
        assert!(matches!(&small, Ok(found) if found.len() == 1 && found[0].estimated_cost == Some(Usd::from_nanos(20_000_000))));
        assert_eq!(ids(small), vec!["openai/text-embedding-3-small"]);
        assert_eq!(ids(resolve_embeddings("vectors", &keys, &catalog, 10)), vec!["google/gemini-embedding-001"]);
        assert!(ids(resolve_embeddings("openai/gpt-4o-mini", &keys, &catalog, 10))[0].contains("NoRunnableModel"));
        assert!(ids(resolve_embeddings("anthropic/claude-whatever", &keys, &catalog, 10))[0].contains("ModelNotFound"));
        assert!(ids(resolve_embeddings("mistral/mistral-embed", &keys, &catalog, 10))[0].contains("ByokRequired"));
        assert!(ids(resolve_embeddings("text-embedding-3-small", &TenantRouting::default(), &catalog, 10))[0].contains("ByokRequired"));
        // A conversation never goes to an embedding model, named or picked by `auto`.
        assert!(matches!(
            resolve("openai/text-embedding-3-small", &keys, &catalog, &request("hi"), &RouteOptions::default()),
            Err(RouteError::NoRunnableModel(_))
        ));
        let auto = resolve("auto", &keys, &catalog, &request("hi"), &RouteOptions::default());
        assert!(
            matches!(&auto, Ok(Resolution::Route(route)) if route.candidates.iter().all(|candidate| candidate.entry.as_ref().is_some_and(|entry| entry.can("chat"))))
        );
        Ok(())
    }

    #[test]
    fn documents_go_to_models_that_read_files_and_urls_only_where_fetched() -> Result<(), crate::catalog::CatalogError> {
        use crate::chat::DocumentSource;
        let catalog = ModelCatalog::bundled()?;
        let keys = tenant(&["openai", "anthropic", "google", "groq"]);
        let with = |source: DocumentSource| {
            let mut request = request("summarize");
            request.messages[0].parts.push(Part::Document { source, name: None });
            request
        };
        let pdf = with(DocumentSource::Base64 { media_type: "application/pdf".to_string(), data: "JVBERi0=".to_string() });
        let by_url = with(DocumentSource::Url("https://example.com/a.pdf".to_string()));
        let text = with(DocumentSource::Text("notes".to_string()));
        let route = |model: &str, request: &ChatRequest| ids(resolve(model, &keys, &catalog, request, &RouteOptions::default()));
        assert_eq!(route("openai/gpt-4o-mini", &pdf), vec!["openai/gpt-4o-mini"]);
        // A model that reads no files, and OpenAI's format for a file it would have to fetch.
        assert!(route("groq/llama-3.3-70b-versatile", &pdf)[0].contains("NoRunnableModel"));
        assert!(route("openai/gpt-4o-mini", &by_url)[0].contains("NoRunnableModel"));
        assert_eq!(route("anthropic/claude-haiku-4-5", &by_url), vec!["anthropic/claude-haiku-4-5"]);
        assert_eq!(route("google/gemini-2.5-flash", &by_url), vec!["google/gemini-2.5-flash"]);
        // Plain text any chat model reads.
        assert_eq!(route("groq/llama-3.3-70b-versatile", &text), vec!["groq/llama-3.3-70b-versatile"]);
        let auto = resolve("auto", &keys, &catalog, &by_url, &RouteOptions::default());
        assert!(
            matches!(&auto, Ok(Resolution::Route(route)) if !route.candidates.is_empty() && route.candidates.iter().all(|candidate| candidate.provider.format != WireFormat::OpenAi && candidate.entry.as_ref().is_some_and(|entry| entry.can("documents"))))
        );
        Ok(())
    }
}
