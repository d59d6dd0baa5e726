//! The prompts-eval service's rules over its store.

use async_trait::async_trait;
use brainstorm_common::store::{Database, is_unique_violation};
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::prompts::*;
use brainstorm_proto::{ServiceError, ServiceResult};
use rand::Rng;
use serde_json::{Map, Value};

use crate::memory::{self, Memory};
use crate::scoring::{self, FULL, SCORERS};
use crate::store::PromptsStore;
use crate::template;

/// Environments, in promotion order.
pub const ENVIRONMENTS: [&str; 3] = ["dev", "staging", "prod"];
const MAX_ID_CHARS: usize = 128;
const MAX_TEMPLATE_BYTES: usize = 100_000;
/// Most cases in one evaluation (the spec's limit).
pub const MAX_CASES: usize = 50;
/// Most runs listed.
const MAX_RUNS_LISTED: i64 = 20;
/// How often a version is retried when another writer took the version number.
const VERSION_RETRIES: usize = 5;
/// Most items added in one call (the spec's limit).
pub const MAX_ITEMS_PER_BATCH: usize = 100;
/// Most items a dataset holds.
pub const MAX_DATASET_ITEMS: u32 = 10_000;
const MAX_NAME_CHARS: usize = 200;
const MAX_DESCRIPTION_CHARS: usize = 2_000;

/// The prompts-eval service.
#[derive(Clone)]
pub struct PromptsEvalServiceImpl {
    store: PromptsStore,
    memory: Memory,
}

impl PromptsEvalServiceImpl {
    /// The service over a migrated database.
    pub fn new(database: Database) -> PromptsEvalServiceImpl {
        PromptsEvalServiceImpl { store: PromptsStore::new(database.clone()), memory: Memory::new(database) }
    }

    async fn existing(&self, tenant_id: &str, prompt_id: &str) -> ServiceResult<Prompt> {
        self.store
            .prompt(tenant_id, prompt_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("prompt_not_found", format!("no prompt `{prompt_id}`: see GET /v1/prompts")))
    }

    async fn with_versions(&self, mut prompt: Prompt) -> ServiceResult<Prompt> {
        prompt.versions = self.store.versions(&prompt.tenant_id, &prompt.id, false).await.map_err(store_failure)?;
        Ok(prompt)
    }

    async fn version_of(&self, prompt: &Prompt, version: u32) -> ServiceResult<PromptVersion> {
        self.store.version(&prompt.tenant_id, &prompt.id, version).await.map_err(store_failure)?.ok_or_else(|| {
            ServiceError::not_found(
                "version_not_found",
                format!("prompt `{}` has no version {version} (latest: {})", prompt.id, prompt.latest_version),
            )
        })
    }

    /// The texts of the memory blocks the template references (`{{memory.<block>}}`) and its defaults
    /// do not fill: each block's core facts, oldest first, one `- fact` line each, from the memory of
    /// `memory_key` (the tenant's when empty). Read once per render or evaluation; no read when the
    /// template references none.
    async fn memory_blocks(
        &self,
        tenant_id: &str,
        memory_key: &str,
        template: &str,
        defaults: &Map<String, Value>,
    ) -> ServiceResult<Map<String, Value>> {
        let wanted: Vec<String> = template::placeholders(template)
            .into_iter()
            .filter(|name| !template::resolves(name, defaults))
            .filter_map(|name| name.strip_prefix("memory.").map(str::to_string))
            .filter(|block| memory::BLOCKS.iter().any(|(known, _)| known == block))
            .collect();
        if wanted.is_empty() {
            return Ok(Map::new());
        }
        let key = MemoryKey { tenant_id: tenant_id.to_string(), memory_key: memory_key.to_string() };
        let view = self.memory.list(MemoryQuery { key: Some(key), block: String::new(), include_archival: false }).await?;
        Ok(wanted
            .into_iter()
            .map(|block| {
                let facts: Vec<String> =
                    view.entries.iter().filter(|entry| entry.block == block).map(|entry| format!("- {}", entry.fact)).collect();
                (block, Value::String(facts.join("\n")))
            })
            .collect())
    }

    async fn ab_view(&self, tenant_id: &str, prompt_id: &str) -> ServiceResult<AbTest> {
        let Some(mut test) = self.store.ab(tenant_id, prompt_id).await.map_err(store_failure)? else {
            return Ok(AbTest { prompt_id: prompt_id.to_string(), ..AbTest::default() });
        };
        for variant in [test.a.as_mut(), test.b.as_mut()].into_iter().flatten() {
            let (runs, average) = self.store.version_scores(tenant_id, prompt_id, variant.version).await.map_err(store_failure)?;
            variant.evaluation_runs = runs;
            variant.avg_score_micros = average;
        }
        Ok(test)
    }
}

fn dataset_name(name: &str) -> ServiceResult<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid("invalid_dataset", format!("name is required, at most {MAX_NAME_CHARS} characters")));
    }
    Ok(name.to_string())
}

fn dataset_description(description: &str) -> ServiceResult<String> {
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(invalid("invalid_dataset", format!("description holds at most {MAX_DESCRIPTION_CHARS} characters")));
    }
    Ok(description.to_string())
}

impl PromptsEvalServiceImpl {
    async fn existing_dataset(&self, tenant_id: &str, dataset_id: &str) -> ServiceResult<Dataset> {
        self.store
            .dataset(tenant_id, dataset_id)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| ServiceError::not_found("dataset_not_found", format!("no dataset `{dataset_id}`: see GET /v1/eval/datasets")))
    }
}

/// Puts the memory blocks' texts where the variables leave `{{memory.<block>}}` unfilled (given
/// variables win).
fn fill_memory(blocks: &Map<String, Value>, variables: &mut Map<String, Value>) {
    let missing: Vec<(&String, &Value)> =
        blocks.iter().filter(|(block, _)| !template::resolves(&format!("memory.{block}"), variables)).collect();
    if missing.is_empty() {
        return;
    }
    // A `memory` variable that is not an object is the caller's: left as given.
    if let Value::Object(given) = variables.entry("memory").or_insert_with(|| Value::Object(Map::new())) {
        for (block, facts) in missing {
            given.entry(block.clone()).or_insert_with(|| facts.clone());
        }
    }
}

fn store_failure(error: sqlx::Error) -> ServiceError {
    ServiceError::internal(format!("the prompts store failed: {error}"))
}

fn invalid(reason: &str, message: impl Into<String>) -> ServiceError {
    ServiceError::invalid(reason, message)
}

/// A JSON object from its text (empty text: an empty object).
fn object(text: &str, what: &str) -> ServiceResult<Map<String, Value>> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(members)) => Ok(members),
        _ => Err(invalid("invalid_prompt", format!("{what} must be a JSON object"))),
    }
}

fn validate_template(template: &str) -> ServiceResult<()> {
    if template.trim().is_empty() || template.len() > MAX_TEMPLATE_BYTES {
        return Err(invalid("invalid_prompt", format!("template is required, at most {MAX_TEMPLATE_BYTES} bytes")));
    }
    Ok(())
}

fn environment_column(environment: &str) -> ServiceResult<&'static str> {
    match environment {
        "dev" => Ok("dev_version"),
        "staging" => Ok("staging_version"),
        "prod" => Ok("prod_version"),
        other => Err(invalid("invalid_environment", format!("environment `{other}` is not one of dev, staging, prod"))),
    }
}

fn serving(prompt: &Prompt, environment: &str) -> u32 {
    match environment {
        "dev" => prompt.dev_version,
        "staging" => prompt.staging_version,
        _ => prompt.prod_version,
    }
}

fn not_archived(prompt: &Prompt) -> ServiceResult<()> {
    if prompt.archived {
        return Err(ServiceError::conflict("prompt_archived", format!("prompt `{}` is archived", prompt.id)));
    }
    Ok(())
}

#[async_trait]
impl PromptsEvalService for PromptsEvalServiceImpl {
    async fn create_prompt(&self, request: CreatePromptRequest) -> ServiceResult<Prompt> {
        let id = request.id.trim();
        if id.is_empty() || id.chars().count() > MAX_ID_CHARS || id.contains('/') {
            return Err(invalid("invalid_prompt", format!("id is required: at most {MAX_ID_CHARS} characters, no `/`")));
        }
        validate_template(&request.template)?;
        let variables = object(&request.variables_json, "variables")?;
        let environment = if request.environment.is_empty() { "dev" } else { request.environment.as_str() };
        environment_column(environment)?;
        let now = now_timestamp();
        let mut prompt = Prompt {
            id: id.to_string(),
            tenant_id: request.tenant_id,
            latest_version: 1,
            created_at: now.clone(),
            updated_at: now.clone(),
            ..Prompt::default()
        };
        match environment {
            "dev" => prompt.dev_version = 1,
            "staging" => prompt.staging_version = 1,
            _ => prompt.prod_version = 1,
        }
        let first = PromptVersion {
            version: 1,
            template: request.template,
            variables_json: Value::Object(variables).to_string(),
            change_note: request.change_note,
            created_at: now,
        };
        match self.store.insert_prompt(&prompt, &first).await {
            Ok(()) => {
                prompt.versions = vec![first];
                Ok(prompt)
            }
            Err(error) if is_unique_violation(&error) => {
                Err(ServiceError::conflict("prompt_exists", format!("prompt `{}` already exists", prompt.id)))
            }
            Err(error) => Err(store_failure(error)),
        }
    }

    async fn list_prompts(&self, request: ListPromptsRequest) -> ServiceResult<PromptList> {
        let mut prompts = self.store.prompts(&request.tenant_id, request.include_archived).await.map_err(store_failure)?;
        for prompt in &mut prompts {
            prompt.versions = self.store.versions(&prompt.tenant_id, &prompt.id, true).await.map_err(store_failure)?;
        }
        Ok(PromptList { prompts })
    }

    async fn get_prompt(&self, request: PromptRef) -> ServiceResult<Prompt> {
        let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
        self.with_versions(prompt).await
    }

    async fn update_prompt(&self, request: UpdatePromptRequest) -> ServiceResult<Prompt> {
        if request.template.is_none() && request.variables_json.is_none() {
            return Err(invalid("invalid_prompt", "an update needs a template or variables (it creates a new version)"));
        }
        if let Some(template) = &request.template {
            validate_template(template)?;
        }
        let variables = request.variables_json.as_deref().map(|text| object(text, "variables")).transpose()?;
        for _ in 0..VERSION_RETRIES {
            let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
            not_archived(&prompt)?;
            let latest = self.version_of(&prompt, prompt.latest_version).await?;
            let version = PromptVersion {
                version: prompt.latest_version + 1,
                template: request.template.clone().unwrap_or(latest.template),
                variables_json: variables.clone().map(|variables| Value::Object(variables).to_string()).unwrap_or(latest.variables_json),
                change_note: request.change_note.clone(),
                created_at: now_timestamp(),
            };
            if self
                .store
                .add_version(&request.tenant_id, &request.prompt_id, prompt.latest_version, &version)
                .await
                .map_err(store_failure)?
            {
                return self.get_prompt(PromptRef { tenant_id: request.tenant_id, prompt_id: request.prompt_id }).await;
            }
        }
        Err(ServiceError::conflict("concurrent_update", "the prompt kept changing while this version was written: retry"))
    }

    async fn archive_prompt(&self, request: PromptRef) -> ServiceResult<Prompt> {
        let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
        if !prompt.archived {
            let now = now_timestamp();
            self.store.archive(&request.tenant_id, &request.prompt_id, &now).await.map_err(store_failure)?;
            self.store.stop_ab(&request.tenant_id, &request.prompt_id, &now).await.map_err(store_failure)?;
        }
        self.get_prompt(request).await
    }

    async fn promote_prompt(&self, request: PromoteRequest) -> ServiceResult<Prompt> {
        let column = environment_column(&request.target_environment)?;
        let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
        not_archived(&prompt)?;
        self.version_of(&prompt, request.version).await?;
        // dev, then staging, then prod: a version reaches an environment from the one before it.
        let position = ENVIRONMENTS.iter().position(|environment| *environment == request.target_environment).unwrap_or(0);
        if let Some(previous) = position.checked_sub(1).map(|before| ENVIRONMENTS[before])
            && serving(&prompt, previous) != request.version
        {
            return Err(ServiceError::conflict(
                "promotion_out_of_order",
                format!(
                    "version {} must serve {previous} before it is promoted to {} ({previous} serves {})",
                    request.version,
                    request.target_environment,
                    match serving(&prompt, previous) {
                        0 => "no version".to_string(),
                        version => format!("version {version}"),
                    }
                ),
            ));
        }
        self.store
            .deploy(&request.tenant_id, &request.prompt_id, column, request.version, &now_timestamp())
            .await
            .map_err(store_failure)?;
        self.get_prompt(PromptRef { tenant_id: request.tenant_id, prompt_id: request.prompt_id }).await
    }

    async fn render_prompt(&self, request: RenderRequest) -> ServiceResult<Rendered> {
        let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
        let mut variables = object(&request.variables_json, "variables")?;
        let (version, is_ab_test) = if request.version != 0 {
            (request.version, false)
        } else if !request.environment.is_empty() {
            environment_column(&request.environment)?;
            match serving(&prompt, &request.environment) {
                0 => {
                    return Err(ServiceError::not_found(
                        "version_not_found",
                        format!("no version of `{}` serves {}", prompt.id, request.environment),
                    ));
                }
                version => (version, false),
            }
        } else {
            match self.store.ab(&request.tenant_id, &request.prompt_id).await.map_err(store_failure)? {
                Some(test) if test.active => {
                    let variant_a = rand::rng().random_range(0..FULL) < test.split_ratio_micros;
                    self.store.expose(&request.tenant_id, &request.prompt_id, variant_a).await.map_err(store_failure)?;
                    let variant = if variant_a { test.a } else { test.b };
                    (variant.map_or(prompt.latest_version, |variant| variant.version), true)
                }
                _ => (prompt.latest_version, false),
            }
        };
        let stored = self.version_of(&prompt, version).await?;
        let defaults = object(&stored.variables_json, "variables")?;
        fill_memory(&self.memory_blocks(&request.tenant_id, &request.memory_key, &stored.template, &defaults).await?, &mut variables);
        let resolved = template::render(&stored.template, &defaults, &variables);
        Ok(Rendered { resolved_text: resolved.text, template_id: prompt.id, version, is_ab_test, missing_variables: resolved.missing })
    }

    async fn set_ab_test(&self, request: AbTestRequest) -> ServiceResult<AbTest> {
        let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
        match request.action.as_str() {
            "start" => {
                not_archived(&prompt)?;
                if request.version_a == request.version_b {
                    return Err(invalid("invalid_ab_test", "version_a and version_b must be two different versions"));
                }
                self.version_of(&prompt, request.version_a).await?;
                self.version_of(&prompt, request.version_b).await?;
                if request.split_ratio_micros == 0 || request.split_ratio_micros >= FULL {
                    return Err(invalid(
                        "invalid_ab_test",
                        "split_ratio (the share of renders given version_a) must be between 0 and 1, exclusive",
                    ));
                }
                let test = AbTest {
                    a: Some(AbVariant { version: request.version_a, ..AbVariant::default() }),
                    b: Some(AbVariant { version: request.version_b, ..AbVariant::default() }),
                    split_ratio_micros: request.split_ratio_micros,
                    started_at: now_timestamp(),
                    ..AbTest::default()
                };
                self.store.start_ab(&request.tenant_id, &request.prompt_id, &test).await.map_err(store_failure)?;
            }
            "stop" => {
                if !self.store.stop_ab(&request.tenant_id, &request.prompt_id, &now_timestamp()).await.map_err(store_failure)? {
                    return Err(ServiceError::conflict("ab_test_not_running", format!("prompt `{}` has no running A/B test", prompt.id)));
                }
            }
            other => return Err(invalid("invalid_ab_test", format!("action `{other}` is not one of start, stop"))),
        }
        self.ab_view(&request.tenant_id, &request.prompt_id).await
    }

    async fn get_ab_test(&self, request: PromptRef) -> ServiceResult<AbTest> {
        self.existing(&request.tenant_id, &request.prompt_id).await?;
        self.ab_view(&request.tenant_id, &request.prompt_id).await
    }

    async fn prepare_evaluation(&self, request: PrepareEvaluationRequest) -> ServiceResult<PreparedEvaluation> {
        let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
        let scorer = if request.scorer.is_empty() { scoring::default_scorer(request.has_model) } else { request.scorer.as_str() };
        if !SCORERS.contains(&scorer) {
            return Err(invalid("invalid_scorer", format!("scorer `{scorer}` is not one of {}", SCORERS.join(", "))));
        }
        if scorer == "llm_judge" && !request.has_model {
            return Err(invalid("invalid_scorer", "llm_judge needs a model to judge with"));
        }
        if request.cases.is_empty() || request.cases.len() > MAX_CASES {
            return Err(invalid("invalid_test_cases", format!("test_cases must hold 1 to {MAX_CASES} cases")));
        }
        let version = if request.version == 0 { prompt.latest_version } else { request.version };
        let stored = self.version_of(&prompt, version).await?;
        let defaults = object(&stored.variables_json, "variables")?;
        let memory = self.memory_blocks(&request.tenant_id, &request.memory_key, &stored.template, &defaults).await?;
        let mut rendered = Vec::with_capacity(request.cases.len());
        for (index, case) in request.cases.iter().enumerate() {
            let mut input = object(&case.input_json, &format!("test_cases[{index}].input"))
                .map_err(|_| invalid("invalid_test_cases", format!("test_cases[{index}].input must be an object")))?;
            fill_memory(&memory, &mut input);
            if scoring::needs_expected(scorer) && !case.has_expected {
                return Err(invalid("invalid_test_cases", format!("test_cases[{index}] needs expected_output for the {scorer} scorer")));
            }
            rendered.push(template::render(&stored.template, &defaults, &input).text);
        }
        Ok(PreparedEvaluation { version, scorer: scorer.to_string(), rendered })
    }

    async fn record_evaluation(&self, request: RecordEvaluationRequest) -> ServiceResult<EvaluationRun> {
        let prompt = self.existing(&request.tenant_id, &request.prompt_id).await?;
        if request.cases.len() != request.rendered.len() || request.cases.len() != request.answers.len() || request.cases.is_empty() {
            return Err(invalid("invalid_evaluation", "every case needs its rendered prompt and its answer"));
        }
        if !SCORERS.contains(&request.scorer.as_str()) {
            return Err(invalid("invalid_scorer", format!("scorer `{}` is not one of {}", request.scorer, SCORERS.join(", "))));
        }
        let mut results = Vec::with_capacity(request.cases.len());
        for ((case, rendered), answer) in request.cases.iter().zip(&request.rendered).zip(&request.answers) {
            let (score_micros, pass) = if answer.error.is_empty() {
                scoring::score(&request.scorer, &case.expected_output, &answer.actual, answer.judge_score_micros)
            } else {
                (0, false)
            };
            results.push(CaseResult {
                input_json: case.input_json.clone(),
                rendered: rendered.clone(),
                expected: case.expected_output.clone(),
                actual: answer.actual.clone(),
                score_micros,
                pass,
                scorer: request.scorer.clone(),
                error: answer.error.clone(),
            });
        }
        let count = u32::try_from(results.len()).unwrap_or(u32::MAX);
        let pass_count = u32::try_from(results.iter().filter(|result| result.pass).count()).unwrap_or(u32::MAX);
        let total: u64 = results.iter().map(|result| u64::from(result.score_micros)).sum();
        let run = EvaluationRun {
            run_id: uuid::Uuid::now_v7().to_string(),
            prompt_id: prompt.id,
            version: request.version,
            scorer: request.scorer,
            model: request.model,
            created_at: now_timestamp(),
            test_case_count: count,
            pass_count,
            fail_count: count - pass_count,
            avg_score_micros: u32::try_from(total / u64::from(count.max(1))).unwrap_or(FULL),
            results,
            stored: request.store,
        };
        if request.store {
            self.store.insert_run(&request.tenant_id, &run).await.map_err(store_failure)?;
        }
        Ok(run)
    }

    async fn list_evaluations(&self, request: PromptRef) -> ServiceResult<EvaluationRunList> {
        self.existing(&request.tenant_id, &request.prompt_id).await?;
        Ok(EvaluationRunList {
            runs: self.store.runs(&request.tenant_id, &request.prompt_id, MAX_RUNS_LISTED).await.map_err(store_failure)?,
        })
    }

    async fn get_evaluation(&self, request: EvaluationRef) -> ServiceResult<EvaluationRun> {
        self.store.run(&request.tenant_id, &request.prompt_id, &request.run_id).await.map_err(store_failure)?.ok_or_else(|| {
            ServiceError::not_found(
                "evaluation_not_found",
                format!("prompt `{}` has no evaluation run `{}`", request.prompt_id, request.run_id),
            )
        })
    }

    async fn create_dataset(&self, request: CreateDatasetRequest) -> ServiceResult<Dataset> {
        let now = now_timestamp();
        let dataset = Dataset {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: request.tenant_id,
            name: dataset_name(&request.name)?,
            description: dataset_description(&request.description)?,
            item_count: 0,
            created_at: now.clone(),
            updated_at: now,
        };
        match self.store.insert_dataset(&dataset).await {
            Ok(()) => Ok(dataset),
            Err(error) if is_unique_violation(&error) => {
                Err(ServiceError::conflict("dataset_exists", format!("a dataset named `{}` exists", dataset.name)))
            }
            Err(error) => Err(store_failure(error)),
        }
    }

    async fn list_datasets(&self, request: TenantRef) -> ServiceResult<DatasetList> {
        Ok(DatasetList { datasets: self.store.datasets(&request.tenant_id).await.map_err(store_failure)? })
    }

    async fn get_dataset(&self, request: DatasetRef) -> ServiceResult<Dataset> {
        self.existing_dataset(&request.tenant_id, &request.dataset_id).await
    }

    async fn update_dataset(&self, request: UpdateDatasetRequest) -> ServiceResult<Dataset> {
        let mut dataset = self.existing_dataset(&request.tenant_id, &request.dataset_id).await?;
        if let Some(name) = &request.name {
            dataset.name = dataset_name(name)?;
        }
        if let Some(description) = &request.description {
            dataset.description = dataset_description(description)?;
        }
        dataset.updated_at = now_timestamp();
        match self.store.update_dataset(&dataset).await {
            Ok(()) => Ok(dataset),
            Err(error) if is_unique_violation(&error) => {
                Err(ServiceError::conflict("dataset_exists", format!("a dataset named `{}` exists", dataset.name)))
            }
            Err(error) => Err(store_failure(error)),
        }
    }

    async fn delete_dataset(&self, request: DatasetRef) -> ServiceResult<Dataset> {
        let dataset = self.existing_dataset(&request.tenant_id, &request.dataset_id).await?;
        self.store.delete_dataset(&request.tenant_id, &request.dataset_id).await.map_err(store_failure)?;
        Ok(dataset)
    }

    async fn add_items(&self, request: AddItemsRequest) -> ServiceResult<ItemList> {
        self.existing_dataset(&request.tenant_id, &request.dataset_id).await?;
        if request.items.is_empty() || request.items.len() > MAX_ITEMS_PER_BATCH {
            return Err(invalid("invalid_items", format!("items must hold 1 to {MAX_ITEMS_PER_BATCH} items")));
        }
        let now = now_timestamp();
        let mut items = Vec::with_capacity(request.items.len());
        for (index, item) in request.items.into_iter().enumerate() {
            let input = object(&item.input_json, "input")
                .map_err(|_| invalid("invalid_items", format!("items[{index}].input must be an object")))?;
            let metadata = object(&item.metadata_json, "metadata")
                .map_err(|_| invalid("invalid_items", format!("items[{index}].metadata must be an object")))?;
            items.push(DatasetItem {
                id: uuid::Uuid::now_v7().to_string(),
                dataset_id: request.dataset_id.clone(),
                input_json: Value::Object(input).to_string(),
                expected_output: item.expected_output,
                metadata_json: Value::Object(metadata).to_string(),
                source_request_id: item.source_request_id,
                created_at: now.clone(),
            });
        }
        match self.store.add_items(&request.tenant_id, &request.dataset_id, &items, MAX_DATASET_ITEMS).await.map_err(store_failure)? {
            Some((items, skipped)) => Ok(ItemList { items, skipped }),
            None => Err(ServiceError::conflict("dataset_full", format!("a dataset holds at most {MAX_DATASET_ITEMS} items"))),
        }
    }

    async fn list_items(&self, request: DatasetRef) -> ServiceResult<ItemList> {
        self.existing_dataset(&request.tenant_id, &request.dataset_id).await?;
        Ok(ItemList { items: self.store.items(&request.tenant_id, &request.dataset_id).await.map_err(store_failure)?, skipped: 0 })
    }

    async fn delete_item(&self, request: ItemRef) -> ServiceResult<DatasetItem> {
        self.existing_dataset(&request.tenant_id, &request.dataset_id).await?;
        self.store.delete_item(&request.tenant_id, &request.dataset_id, &request.item_id).await.map_err(store_failure)?.ok_or_else(|| {
            ServiceError::not_found("item_not_found", format!("dataset `{}` has no item `{}`", request.dataset_id, request.item_id))
        })
    }
    async fn add_memory(&self, request: AddMemoryRequest) -> ServiceResult<AddMemoryResponse> {
        self.memory.add(request).await
    }

    async fn update_memory(&self, request: UpdateMemoryRequest) -> ServiceResult<MemoryEntry> {
        self.memory.update(request).await
    }

    async fn delete_memory(&self, request: MemoryEntryRef) -> ServiceResult<MemoryEntry> {
        self.memory.delete(request).await
    }

    async fn list_memory(&self, request: MemoryQuery) -> ServiceResult<MemoryView> {
        self.memory.list(request).await
    }

    async fn memory_audit(&self, request: MemoryAuditQuery) -> ServiceResult<MemoryAuditList> {
        self.memory.audit_trail(request).await
    }

    async fn memory_stats(&self, request: MemoryStatsRequest) -> ServiceResult<MemoryStats> {
        self.memory.stats(request).await
    }

    async fn memory_compliance(&self, request: MemoryKey) -> ServiceResult<ComplianceReport> {
        self.memory.compliance(request).await
    }
}
