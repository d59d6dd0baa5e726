//! The prompts-eval tables, on SQLite or PostgreSQL.

use brainstorm_common::store::Database;
use brainstorm_proto::prompts::{AbTest, AbVariant, CaseResult, Dataset, DatasetItem, EvaluationRun, Prompt, PromptVersion};
use sqlx::Row;
use sqlx::any::AnyRow;

pub type StoreResult<T> = Result<T, sqlx::Error>;

#[derive(Debug, Clone)]
pub struct PromptsStore {
    database: Database,
}

const PROMPT_COLUMNS: &str = "id, tenant_id, latest_version, dev_version, staging_version, prod_version, archived, created_at, updated_at";
const RUN_COLUMNS: &str =
    "run_id, prompt_id, version, scorer, model, created_at, test_case_count, pass_count, fail_count, avg_score_micros";

fn number(row: &AnyRow, column: &str) -> StoreResult<u32> {
    Ok(u32::try_from(row.try_get::<i64, _>(column)?).unwrap_or_default())
}

fn prompt_from_row(row: &AnyRow) -> StoreResult<Prompt> {
    Ok(Prompt {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        latest_version: number(row, "latest_version")?,
        dev_version: number(row, "dev_version")?,
        staging_version: number(row, "staging_version")?,
        prod_version: number(row, "prod_version")?,
        archived: row.try_get::<i64, _>("archived")? != 0,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        versions: Vec::new(),
    })
}

fn version_from_row(row: &AnyRow) -> StoreResult<PromptVersion> {
    Ok(PromptVersion {
        version: number(row, "version")?,
        template: row.try_get("template")?,
        variables_json: row.try_get("variables")?,
        change_note: row.try_get("change_note")?,
        created_at: row.try_get("created_at")?,
    })
}

fn run_from_row(row: &AnyRow) -> StoreResult<EvaluationRun> {
    Ok(EvaluationRun {
        run_id: row.try_get("run_id")?,
        prompt_id: row.try_get("prompt_id")?,
        version: number(row, "version")?,
        scorer: row.try_get("scorer")?,
        model: row.try_get("model")?,
        created_at: row.try_get("created_at")?,
        test_case_count: number(row, "test_case_count")?,
        pass_count: number(row, "pass_count")?,
        fail_count: number(row, "fail_count")?,
        avg_score_micros: number(row, "avg_score_micros")?,
        results: Vec::new(),
        stored: true,
    })
}

impl PromptsStore {
    pub fn new(database: Database) -> PromptsStore {
        PromptsStore { database }
    }

    /// Inserts a prompt and its first version (a unique violation when the id is taken).
    pub async fn insert_prompt(&self, prompt: &Prompt, first: &PromptVersion) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query(&format!("INSERT INTO prompts ({PROMPT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"))
            .bind(&prompt.id)
            .bind(&prompt.tenant_id)
            .bind(i64::from(prompt.latest_version))
            .bind(i64::from(prompt.dev_version))
            .bind(i64::from(prompt.staging_version))
            .bind(i64::from(prompt.prod_version))
            .bind(i64::from(prompt.archived))
            .bind(&prompt.created_at)
            .bind(&prompt.updated_at)
            .execute(&mut *transaction)
            .await?;
        insert_version(&mut transaction, &prompt.tenant_id, &prompt.id, first).await?;
        transaction.commit().await
    }

    /// Adds the next version unless another writer added it first (false: retry on the new latest).
    pub async fn add_version(&self, tenant_id: &str, prompt_id: &str, previous: u32, version: &PromptVersion) -> StoreResult<bool> {
        let mut transaction = self.database.begin().await?;
        let moved =
            sqlx::query("UPDATE prompts SET latest_version = $1, updated_at = $2 WHERE tenant_id = $3 AND id = $4 AND latest_version = $5")
                .bind(i64::from(version.version))
                .bind(&version.created_at)
                .bind(tenant_id)
                .bind(prompt_id)
                .bind(i64::from(previous))
                .execute(&mut *transaction)
                .await?;
        if moved.rows_affected() != 1 {
            return Ok(false);
        }
        insert_version(&mut transaction, tenant_id, prompt_id, version).await?;
        transaction.commit().await?;
        Ok(true)
    }

    pub async fn prompt(&self, tenant_id: &str, prompt_id: &str) -> StoreResult<Option<Prompt>> {
        let row = sqlx::query(&format!("SELECT {PROMPT_COLUMNS} FROM prompts WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant_id)
            .bind(prompt_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(prompt_from_row).transpose()
    }

    pub async fn prompts(&self, tenant_id: &str, include_archived: bool) -> StoreResult<Vec<Prompt>> {
        let rows =
            sqlx::query(&format!("SELECT {PROMPT_COLUMNS} FROM prompts WHERE tenant_id = $1 AND (archived = 0 OR $2 = 1) ORDER BY id"))
                .bind(tenant_id)
                .bind(i64::from(include_archived))
                .fetch_all(self.database.pool())
                .await?;
        rows.iter().map(prompt_from_row).collect()
    }

    /// Every version of a prompt, newest first (only the latest with `latest_only`).
    pub async fn versions(&self, tenant_id: &str, prompt_id: &str, latest_only: bool) -> StoreResult<Vec<PromptVersion>> {
        let limit = if latest_only { 1 } else { i64::MAX };
        let rows = sqlx::query(
            "SELECT version, template, variables, change_note, created_at FROM prompt_versions WHERE tenant_id = $1 AND prompt_id = $2 \
             ORDER BY version DESC LIMIT $3",
        )
        .bind(tenant_id)
        .bind(prompt_id)
        .bind(limit)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(version_from_row).collect()
    }

    pub async fn version(&self, tenant_id: &str, prompt_id: &str, version: u32) -> StoreResult<Option<PromptVersion>> {
        let row = sqlx::query(
            "SELECT version, template, variables, change_note, created_at FROM prompt_versions WHERE tenant_id = $1 AND prompt_id = $2 AND version = $3",
        )
        .bind(tenant_id)
        .bind(prompt_id)
        .bind(i64::from(version))
        .fetch_optional(self.database.pool())
        .await?;
        row.as_ref().map(version_from_row).transpose()
    }

    pub async fn archive(&self, tenant_id: &str, prompt_id: &str, now: &str) -> StoreResult<()> {
        sqlx::query("UPDATE prompts SET archived = 1, updated_at = $1 WHERE tenant_id = $2 AND id = $3")
            .bind(now)
            .bind(tenant_id)
            .bind(prompt_id)
            .execute(self.database.pool())
            .await
            .map(drop)
    }

    /// Points `environment` (a column name the service chose from its own list) at `version`.
    pub async fn deploy(&self, tenant_id: &str, prompt_id: &str, column: &'static str, version: u32, now: &str) -> StoreResult<()> {
        sqlx::query(&format!("UPDATE prompts SET {column} = $1, updated_at = $2 WHERE tenant_id = $3 AND id = $4"))
            .bind(i64::from(version))
            .bind(now)
            .bind(tenant_id)
            .bind(prompt_id)
            .execute(self.database.pool())
            .await
            .map(drop)
    }

    /// Starts (or restarts, counts from zero) a prompt's A/B test.
    pub async fn start_ab(&self, tenant_id: &str, prompt_id: &str, test: &AbTest) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM prompt_ab_tests WHERE tenant_id = $1 AND prompt_id = $2")
            .bind(tenant_id)
            .bind(prompt_id)
            .execute(&mut *transaction)
            .await?;
        sqlx::query(
            "INSERT INTO prompt_ab_tests (tenant_id, prompt_id, active, version_a, version_b, split_ratio_micros, exposures_a, exposures_b, started_at, stopped_at) \
             VALUES ($1, $2, 1, $3, $4, $5, 0, 0, $6, '')",
        )
        .bind(tenant_id)
        .bind(prompt_id)
        .bind(i64::from(test.a.as_ref().map_or(0, |variant| variant.version)))
        .bind(i64::from(test.b.as_ref().map_or(0, |variant| variant.version)))
        .bind(i64::from(test.split_ratio_micros))
        .bind(&test.started_at)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await
    }

    /// Stops the active test; false when none was active.
    pub async fn stop_ab(&self, tenant_id: &str, prompt_id: &str, now: &str) -> StoreResult<bool> {
        let stopped =
            sqlx::query("UPDATE prompt_ab_tests SET active = 0, stopped_at = $1 WHERE tenant_id = $2 AND prompt_id = $3 AND active = 1")
                .bind(now)
                .bind(tenant_id)
                .bind(prompt_id)
                .execute(self.database.pool())
                .await?;
        Ok(stopped.rows_affected() == 1)
    }

    pub async fn ab(&self, tenant_id: &str, prompt_id: &str) -> StoreResult<Option<AbTest>> {
        let row = sqlx::query(
            "SELECT active, version_a, version_b, split_ratio_micros, exposures_a, exposures_b, started_at, stopped_at FROM prompt_ab_tests \
             WHERE tenant_id = $1 AND prompt_id = $2",
        )
        .bind(tenant_id)
        .bind(prompt_id)
        .fetch_optional(self.database.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let variant = |version: &str, exposures: &str| -> StoreResult<AbVariant> {
            Ok(AbVariant {
                version: number(&row, version)?,
                exposures: u64::try_from(row.try_get::<i64, _>(exposures)?).unwrap_or_default(),
                ..AbVariant::default()
            })
        };
        Ok(Some(AbTest {
            prompt_id: prompt_id.to_string(),
            active: row.try_get::<i64, _>("active")? != 0,
            exists: true,
            split_ratio_micros: number(&row, "split_ratio_micros")?,
            a: Some(variant("version_a", "exposures_a")?),
            b: Some(variant("version_b", "exposures_b")?),
            started_at: row.try_get("started_at")?,
            stopped_at: row.try_get("stopped_at")?,
        }))
    }

    /// Counts one render of variant A (`true`) or B of the active test.
    pub async fn expose(&self, tenant_id: &str, prompt_id: &str, variant_a: bool) -> StoreResult<()> {
        let column = if variant_a { "exposures_a" } else { "exposures_b" };
        sqlx::query(&format!("UPDATE prompt_ab_tests SET {column} = {column} + 1 WHERE tenant_id = $1 AND prompt_id = $2 AND active = 1"))
            .bind(tenant_id)
            .bind(prompt_id)
            .execute(self.database.pool())
            .await
            .map(drop)
    }

    /// Stores a run and its cases.
    pub async fn insert_run(&self, tenant_id: &str, run: &EvaluationRun) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query(&format!(
            "INSERT INTO prompt_eval_runs (tenant_id, {RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
        ))
        .bind(tenant_id)
        .bind(&run.run_id)
        .bind(&run.prompt_id)
        .bind(i64::from(run.version))
        .bind(&run.scorer)
        .bind(&run.model)
        .bind(&run.created_at)
        .bind(i64::from(run.test_case_count))
        .bind(i64::from(run.pass_count))
        .bind(i64::from(run.fail_count))
        .bind(i64::from(run.avg_score_micros))
        .execute(&mut *transaction)
        .await?;
        for (position, result) in run.results.iter().enumerate() {
            sqlx::query(
                "INSERT INTO prompt_eval_results (run_id, position, input, rendered, expected, actual, score_micros, pass, scorer, error) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(&run.run_id)
            .bind(i64::try_from(position).unwrap_or(i64::MAX))
            .bind(&result.input_json)
            .bind(&result.rendered)
            .bind(&result.expected)
            .bind(&result.actual)
            .bind(i64::from(result.score_micros))
            .bind(i64::from(result.pass))
            .bind(&result.scorer)
            .bind(&result.error)
            .execute(&mut *transaction)
            .await?;
        }
        transaction.commit().await
    }

    /// A prompt's newest `limit` runs, without cases.
    pub async fn runs(&self, tenant_id: &str, prompt_id: &str, limit: i64) -> StoreResult<Vec<EvaluationRun>> {
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM prompt_eval_runs WHERE tenant_id = $1 AND prompt_id = $2 ORDER BY created_at DESC, run_id DESC LIMIT $3"
        ))
        .bind(tenant_id)
        .bind(prompt_id)
        .bind(limit)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// The number of stored runs of each version, and their mean score.
    pub async fn version_scores(&self, tenant_id: &str, prompt_id: &str, version: u32) -> StoreResult<(u32, Option<u32>)> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS runs, CAST(COALESCE(SUM(avg_score_micros), 0) AS BIGINT) AS total FROM prompt_eval_runs WHERE tenant_id = $1 AND prompt_id = $2 AND version = $3",
        )
        .bind(tenant_id)
        .bind(prompt_id)
        .bind(i64::from(version))
        .fetch_one(self.database.pool())
        .await?;
        let runs = u32::try_from(row.try_get::<i64, _>("runs")?).unwrap_or_default();
        let total: i64 = row.try_get("total")?;
        Ok((runs, (runs > 0).then(|| u32::try_from(total / i64::from(runs)).unwrap_or_default())))
    }

    /// One run with its cases.
    pub async fn run(&self, tenant_id: &str, prompt_id: &str, run_id: &str) -> StoreResult<Option<EvaluationRun>> {
        let row =
            sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM prompt_eval_runs WHERE tenant_id = $1 AND prompt_id = $2 AND run_id = $3"))
                .bind(tenant_id)
                .bind(prompt_id)
                .bind(run_id)
                .fetch_optional(self.database.pool())
                .await?;
        let Some(mut run) = row.as_ref().map(run_from_row).transpose()? else { return Ok(None) };
        let rows = sqlx::query(
            "SELECT input, rendered, expected, actual, score_micros, pass, scorer, error FROM prompt_eval_results WHERE run_id = $1 ORDER BY position",
        )
        .bind(run_id)
        .fetch_all(self.database.pool())
        .await?;
        for row in &rows {
            run.results.push(CaseResult {
                input_json: row.try_get("input")?,
                rendered: row.try_get("rendered")?,
                expected: row.try_get("expected")?,
                actual: row.try_get("actual")?,
                score_micros: number(row, "score_micros")?,
                pass: row.try_get::<i64, _>("pass")? != 0,
                scorer: row.try_get("scorer")?,
                error: row.try_get("error")?,
            });
        }
        Ok(Some(run))
    }
}

const DATASET_COLUMNS: &str = "id, tenant_id, name, description, created_at, updated_at";
const ITEM_COLUMNS: &str = "id, dataset_id, input, expected_output, metadata, source_request_id, created_at";

fn dataset_from_row(row: &AnyRow) -> StoreResult<Dataset> {
    Ok(Dataset {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        name: row.try_get("name")?,
        description: row.try_get("description")?,
        item_count: number(row, "item_count")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn item_from_row(row: &AnyRow) -> StoreResult<DatasetItem> {
    Ok(DatasetItem {
        id: row.try_get("id")?,
        dataset_id: row.try_get("dataset_id")?,
        input_json: row.try_get("input")?,
        expected_output: row.try_get("expected_output")?,
        metadata_json: row.try_get("metadata")?,
        source_request_id: row.try_get("source_request_id")?,
        created_at: row.try_get("created_at")?,
    })
}

impl PromptsStore {
    /// Inserts a dataset (a unique violation when the tenant has one of that name).
    pub async fn insert_dataset(&self, dataset: &Dataset) -> StoreResult<()> {
        sqlx::query(&format!("INSERT INTO eval_datasets ({DATASET_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"))
            .bind(&dataset.id)
            .bind(&dataset.tenant_id)
            .bind(&dataset.name)
            .bind(&dataset.description)
            .bind(&dataset.created_at)
            .bind(&dataset.updated_at)
            .execute(self.database.pool())
            .await
            .map(drop)
    }

    pub async fn datasets(&self, tenant_id: &str) -> StoreResult<Vec<Dataset>> {
        let rows = sqlx::query(&format!(
            "SELECT {DATASET_COLUMNS}, (SELECT COUNT(*) FROM eval_dataset_items i WHERE i.dataset_id = d.id) AS item_count \
             FROM eval_datasets d WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(dataset_from_row).collect()
    }

    pub async fn dataset(&self, tenant_id: &str, dataset_id: &str) -> StoreResult<Option<Dataset>> {
        let row = sqlx::query(&format!(
            "SELECT {DATASET_COLUMNS}, (SELECT COUNT(*) FROM eval_dataset_items i WHERE i.dataset_id = d.id) AS item_count \
             FROM eval_datasets d WHERE tenant_id = $1 AND id = $2"
        ))
        .bind(tenant_id)
        .bind(dataset_id)
        .fetch_optional(self.database.pool())
        .await?;
        row.as_ref().map(dataset_from_row).transpose()
    }

    pub async fn update_dataset(&self, dataset: &Dataset) -> StoreResult<()> {
        sqlx::query("UPDATE eval_datasets SET name = $1, description = $2, updated_at = $3 WHERE tenant_id = $4 AND id = $5")
            .bind(&dataset.name)
            .bind(&dataset.description)
            .bind(&dataset.updated_at)
            .bind(&dataset.tenant_id)
            .bind(&dataset.id)
            .execute(self.database.pool())
            .await
            .map(drop)
    }

    pub async fn delete_dataset(&self, tenant_id: &str, dataset_id: &str) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM eval_dataset_items WHERE tenant_id = $1 AND dataset_id = $2")
            .bind(tenant_id)
            .bind(dataset_id)
            .execute(&mut *transaction)
            .await?;
        sqlx::query("DELETE FROM eval_datasets WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(dataset_id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await
    }

    /// Appends items in one transaction, skipping those whose source request the dataset already
    /// holds; returns the items added and how many were skipped. Refused (false) when the dataset
    /// would then hold more than `max_items`.
    pub async fn add_items(
        &self,
        tenant_id: &str,
        dataset_id: &str,
        items: &[DatasetItem],
        max_items: u32,
    ) -> StoreResult<Option<(Vec<DatasetItem>, u32)>> {
        let mut transaction = self.database.begin().await?;
        let held: i64 = sqlx::query("SELECT COUNT(*) AS held FROM eval_dataset_items WHERE dataset_id = $1")
            .bind(dataset_id)
            .fetch_one(&mut *transaction)
            .await?
            .try_get("held")?;
        let mut added = Vec::new();
        let mut skipped = 0;
        for item in items {
            if !item.source_request_id.is_empty() {
                let present = sqlx::query("SELECT id FROM eval_dataset_items WHERE dataset_id = $1 AND source_request_id = $2")
                    .bind(dataset_id)
                    .bind(&item.source_request_id)
                    .fetch_optional(&mut *transaction)
                    .await?;
                if present.is_some() || added.iter().any(|other: &DatasetItem| other.source_request_id == item.source_request_id) {
                    skipped += 1;
                    continue;
                }
            }
            sqlx::query(&format!("INSERT INTO eval_dataset_items (tenant_id, {ITEM_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"))
                .bind(tenant_id)
                .bind(&item.id)
                .bind(dataset_id)
                .bind(&item.input_json)
                .bind(&item.expected_output)
                .bind(&item.metadata_json)
                .bind(&item.source_request_id)
                .bind(&item.created_at)
                .execute(&mut *transaction)
                .await?;
            added.push(item.clone());
        }
        if held + i64::try_from(added.len()).unwrap_or(i64::MAX) > i64::from(max_items) {
            return Ok(None);
        }
        transaction.commit().await?;
        Ok(Some((added, skipped)))
    }

    pub async fn items(&self, tenant_id: &str, dataset_id: &str) -> StoreResult<Vec<DatasetItem>> {
        let rows = sqlx::query(&format!(
            "SELECT {ITEM_COLUMNS} FROM eval_dataset_items WHERE tenant_id = $1 AND dataset_id = $2 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .bind(dataset_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(item_from_row).collect()
    }

    /// Deletes one item; None when the dataset has no such item.
    pub async fn delete_item(&self, tenant_id: &str, dataset_id: &str, item_id: &str) -> StoreResult<Option<DatasetItem>> {
        let mut transaction = self.database.begin().await?;
        let row =
            sqlx::query(&format!("SELECT {ITEM_COLUMNS} FROM eval_dataset_items WHERE tenant_id = $1 AND dataset_id = $2 AND id = $3"))
                .bind(tenant_id)
                .bind(dataset_id)
                .bind(item_id)
                .fetch_optional(&mut *transaction)
                .await?;
        let Some(item) = row.as_ref().map(item_from_row).transpose()? else { return Ok(None) };
        sqlx::query("DELETE FROM eval_dataset_items WHERE id = $1").bind(item_id).execute(&mut *transaction).await?;
        transaction.commit().await?;
        Ok(Some(item))
    }
}

async fn insert_version(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    tenant_id: &str,
    prompt_id: &str,
    version: &PromptVersion,
) -> StoreResult<()> {
    sqlx::query("INSERT INTO prompt_versions (tenant_id, prompt_id, version, template, variables, change_note, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(tenant_id)
        .bind(prompt_id)
        .bind(i64::from(version.version))
        .bind(&version.template)
        .bind(&version.variables_json)
        .bind(&version.change_note)
        .bind(&version.created_at)
        .execute(&mut **transaction)
        .await
        .map(drop)
}
