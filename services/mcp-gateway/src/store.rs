//! The MCP gateway's tables, on SQLite or PostgreSQL.

use brainstorm_common::store::Database;
use brainstorm_proto::mcp::{Approval, AuditEntry, McpServer, Tool, ToolPolicy};
use brainstorm_providers::vault::SealedSecret;
use sqlx::Row;
use sqlx::any::AnyRow;

pub type StoreResult<T> = Result<T, sqlx::Error>;

/// A server row: what is shown, and the sealed credential (empty fields when it has none).
#[derive(Debug, Clone)]
pub struct StoredServer {
    pub server: McpServer,
    pub sealed: SealedSecret,
}

/// The MCP gateway's store.
#[derive(Debug, Clone)]
pub struct McpStore {
    database: Database,
}

const SERVER_COLUMNS: &str = "id, tenant_id, name, transport, url, auth_type, auth_header_name, auth_token_hint, ciphertext, nonce, \
     wrapped_key, key_nonce, allowed_key_ids, created_at, updated_at, last_discovered_at";
const APPROVAL_COLUMNS: &str =
    "id, created_at, server_id, server_name, tool, arguments, status, api_key_id, decided_at, decided_by, result, error";

impl McpStore {
    pub fn new(database: Database) -> McpStore {
        McpStore { database }
    }

    /// Inserts a server (a unique violation when the tenant already has one of that name).
    pub async fn insert_server(&self, stored: &StoredServer) -> StoreResult<()> {
        let statement = format!(
            "INSERT INTO mcp_servers ({SERVER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
        );
        bind_server(sqlx::query(&statement), stored).execute(self.database.pool()).await.map(drop)
    }

    /// Replaces a server's row (by id and tenant).
    pub async fn update_server(&self, stored: &StoredServer) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM mcp_servers WHERE id = $1 AND tenant_id = $2")
            .bind(&stored.server.id)
            .bind(&stored.server.tenant_id)
            .execute(&mut *transaction)
            .await?;
        let statement = format!(
            "INSERT INTO mcp_servers ({SERVER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)"
        );
        bind_server(sqlx::query(&statement), stored).execute(&mut *transaction).await?;
        transaction.commit().await
    }

    /// The tenant's servers, each with its tool count.
    pub async fn servers(&self, tenant_id: &str) -> StoreResult<Vec<StoredServer>> {
        let rows = sqlx::query(&format!(
            "SELECT {SERVER_COLUMNS}, (SELECT COUNT(*) FROM mcp_tools t WHERE t.server_id = s.id) AS tool_count \
             FROM mcp_servers s WHERE tenant_id = $1 ORDER BY created_at, id"
        ))
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(server_from_row).collect()
    }

    /// A server by id, else by name.
    pub async fn server(&self, tenant_id: &str, id_or_name: &str) -> StoreResult<Option<StoredServer>> {
        let row = sqlx::query(&format!(
            "SELECT {SERVER_COLUMNS}, (SELECT COUNT(*) FROM mcp_tools t WHERE t.server_id = s.id) AS tool_count \
             FROM mcp_servers s WHERE tenant_id = $1 AND (id = $2 OR name = $2) ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END"
        ))
        .bind(tenant_id)
        .bind(id_or_name)
        .fetch_optional(self.database.pool())
        .await?;
        row.as_ref().map(server_from_row).transpose()
    }

    /// Deletes a server and its tools.
    pub async fn delete_server(&self, tenant_id: &str, server_id: &str) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM mcp_tools WHERE server_id = $1 AND tenant_id = $2")
            .bind(server_id)
            .bind(tenant_id)
            .execute(&mut *transaction)
            .await?;
        sqlx::query("DELETE FROM mcp_servers WHERE id = $1 AND tenant_id = $2")
            .bind(server_id)
            .bind(tenant_id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await
    }

    /// Replaces a server's saved tools and stamps its discovery time.
    pub async fn replace_tools(&self, tenant_id: &str, server_id: &str, tools: &[Tool], now: &str) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM mcp_tools WHERE server_id = $1 AND tenant_id = $2")
            .bind(server_id)
            .bind(tenant_id)
            .execute(&mut *transaction)
            .await?;
        for tool in tools {
            sqlx::query("INSERT INTO mcp_tools (tenant_id, server_id, name, description, input_schema) VALUES ($1, $2, $3, $4, $5)")
                .bind(tenant_id)
                .bind(server_id)
                .bind(&tool.name)
                .bind(&tool.description)
                .bind(&tool.input_schema_json)
                .execute(&mut *transaction)
                .await?;
        }
        sqlx::query("UPDATE mcp_servers SET last_discovered_at = $1 WHERE id = $2 AND tenant_id = $3")
            .bind(now)
            .bind(server_id)
            .bind(tenant_id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await
    }

    /// The tenant's saved tools, by server name then tool name.
    pub async fn tools(&self, tenant_id: &str) -> StoreResult<Vec<Tool>> {
        let rows = sqlx::query(
            "SELECT t.server_id, s.name AS server_name, t.name, t.description, t.input_schema FROM mcp_tools t \
             JOIN mcp_servers s ON s.id = t.server_id WHERE t.tenant_id = $1 ORDER BY s.name, t.name",
        )
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Tool {
                    server_id: row.try_get("server_id")?,
                    server_name: row.try_get("server_name")?,
                    name: row.try_get("name")?,
                    description: row.try_get("description")?,
                    input_schema_json: row.try_get("input_schema")?,
                })
            })
            .collect()
    }

    /// Creates or replaces one tool's policy.
    pub async fn put_policy(&self, tenant_id: &str, policy: &ToolPolicy) -> StoreResult<()> {
        let mut transaction = self.database.begin().await?;
        sqlx::query("DELETE FROM mcp_tool_policies WHERE tenant_id = $1 AND tool_name = $2")
            .bind(tenant_id)
            .bind(&policy.tool_name)
            .execute(&mut *transaction)
            .await?;
        sqlx::query(
            "INSERT INTO mcp_tool_policies (tenant_id, tool_name, allowed, requires_approval, max_cost_nanos, updated_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(tenant_id)
        .bind(&policy.tool_name)
        .bind(i64::from(policy.allowed))
        .bind(i64::from(policy.requires_approval))
        .bind(policy.max_cost_nanos)
        .bind(&policy.updated_at)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await
    }

    /// The tenant's tool policies, by tool name.
    pub async fn policies(&self, tenant_id: &str) -> StoreResult<Vec<ToolPolicy>> {
        let rows = sqlx::query(
            "SELECT tool_name, allowed, requires_approval, max_cost_nanos, updated_at FROM mcp_tool_policies WHERE tenant_id = $1 ORDER BY tool_name",
        )
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ToolPolicy {
                    tool_name: row.try_get("tool_name")?,
                    allowed: row.try_get::<i64, _>("allowed")? != 0,
                    requires_approval: row.try_get::<i64, _>("requires_approval")? != 0,
                    max_cost_nanos: row.try_get("max_cost_nanos")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    /// Queues an approval unless the same key already waits on the same call (same server, tool and
    /// arguments); returns the approval the call waits in and whether it is new.
    pub async fn queue_approval(&self, tenant_id: &str, approval: &Approval, arguments_hash: &str) -> StoreResult<(Approval, bool)> {
        let mut transaction = self.database.begin().await?;
        let waiting = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM mcp_approvals WHERE tenant_id = $1 AND server_id = $2 AND tool = $3 AND arguments_hash = $4 \
             AND api_key_id = $5 AND status = 'pending' ORDER BY created_at"
        ))
        .bind(tenant_id)
        .bind(&approval.server_id)
        .bind(&approval.tool)
        .bind(arguments_hash)
        .bind(&approval.api_key_id)
        .fetch_optional(&mut *transaction)
        .await?;
        if let Some(row) = waiting {
            return Ok((approval_from_row(&row)?, false));
        }
        sqlx::query(&format!(
            "INSERT INTO mcp_approvals (tenant_id, arguments_hash, {APPROVAL_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
        ))
        .bind(tenant_id)
        .bind(arguments_hash)
        .bind(&approval.id)
        .bind(&approval.timestamp)
        .bind(&approval.server_id)
        .bind(&approval.server_name)
        .bind(&approval.tool)
        .bind(&approval.arguments_json)
        .bind(&approval.status)
        .bind(&approval.api_key_id)
        .bind(&approval.decided_at)
        .bind(&approval.decided_by)
        .bind(&approval.result_json)
        .bind(&approval.error)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok((approval.clone(), true))
    }

    /// The tenant's approvals of `status` (every status when empty), newest first.
    pub async fn approvals(&self, tenant_id: &str, status: &str) -> StoreResult<Vec<Approval>> {
        let rows = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM mcp_approvals WHERE tenant_id = $1 AND ($2 = '' OR status = $2) ORDER BY created_at DESC, id LIMIT 500"
        ))
        .bind(tenant_id)
        .bind(status)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(approval_from_row).collect()
    }

    pub async fn approval(&self, tenant_id: &str, id: &str) -> StoreResult<Option<Approval>> {
        let row = sqlx::query(&format!("SELECT {APPROVAL_COLUMNS} FROM mcp_approvals WHERE tenant_id = $1 AND id = $2"))
            .bind(tenant_id)
            .bind(id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(approval_from_row).transpose()
    }

    /// Moves a pending approval to `status`; false when it was no longer pending (another decision won).
    pub async fn decide(&self, tenant_id: &str, id: &str, status: &str, decided_by: &str, now: &str) -> StoreResult<bool> {
        let decided = sqlx::query(
            "UPDATE mcp_approvals SET status = $1, decided_by = $2, decided_at = $3 WHERE tenant_id = $4 AND id = $5 AND status = 'pending'",
        )
        .bind(status)
        .bind(decided_by)
        .bind(now)
        .bind(tenant_id)
        .bind(id)
        .execute(self.database.pool())
        .await?;
        Ok(decided.rows_affected() == 1)
    }

    /// Records what an approved call answered.
    pub async fn record_outcome(&self, tenant_id: &str, id: &str, result_json: &str, error: &str) -> StoreResult<()> {
        sqlx::query("UPDATE mcp_approvals SET result = $1, error = $2 WHERE tenant_id = $3 AND id = $4")
            .bind(result_json)
            .bind(error)
            .bind(tenant_id)
            .bind(id)
            .execute(self.database.pool())
            .await
            .map(drop)
    }

    pub async fn pending_count(&self, tenant_id: &str) -> StoreResult<u32> {
        let count: i64 = sqlx::query("SELECT COUNT(*) AS pending FROM mcp_approvals WHERE tenant_id = $1 AND status = 'pending'")
            .bind(tenant_id)
            .fetch_one(self.database.pool())
            .await?
            .try_get("pending")?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }

    pub async fn insert_audit(&self, tenant_id: &str, entry: &AuditEntry) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO mcp_audit (id, tenant_id, created_at, server_id, server_name, tool, result, latency_ms, api_key_id, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&entry.id)
        .bind(tenant_id)
        .bind(&entry.timestamp)
        .bind(&entry.server_id)
        .bind(&entry.server_name)
        .bind(&entry.tool)
        .bind(&entry.result)
        .bind(i64::try_from(entry.latency_ms).unwrap_or(i64::MAX))
        .bind(&entry.api_key_id)
        .bind(&entry.detail)
        .execute(self.database.pool())
        .await
        .map(drop)
    }

    /// The tenant's newest `limit` audit entries, newest first.
    pub async fn audit(&self, tenant_id: &str, limit: u32) -> StoreResult<Vec<AuditEntry>> {
        let rows = sqlx::query(
            "SELECT id, created_at, server_id, server_name, tool, result, latency_ms, api_key_id, detail FROM mcp_audit \
             WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2",
        )
        .bind(tenant_id)
        .bind(i64::from(limit))
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(AuditEntry {
                    id: row.try_get("id")?,
                    timestamp: row.try_get("created_at")?,
                    server_id: row.try_get("server_id")?,
                    server_name: row.try_get("server_name")?,
                    tool: row.try_get("tool")?,
                    result: row.try_get("result")?,
                    latency_ms: u64::try_from(row.try_get::<i64, _>("latency_ms")?).unwrap_or_default(),
                    api_key_id: row.try_get("api_key_id")?,
                    detail: row.try_get("detail")?,
                })
            })
            .collect()
    }
}

fn bind_server<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    stored: &'q StoredServer,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    let server = &stored.server;
    query
        .bind(&server.id)
        .bind(&server.tenant_id)
        .bind(&server.name)
        .bind(&server.transport)
        .bind(&server.url)
        .bind(&server.auth_type)
        .bind(&server.auth_header_name)
        .bind(&server.auth_token_hint)
        .bind(&stored.sealed.ciphertext)
        .bind(&stored.sealed.nonce)
        .bind(&stored.sealed.wrapped_key)
        .bind(&stored.sealed.key_nonce)
        .bind(serde_json::to_string(&server.allowed_key_ids).unwrap_or_else(|_| "[]".to_string()))
        .bind(&server.created_at)
        .bind(&server.updated_at)
        .bind(&server.last_discovered_at)
}

fn server_from_row(row: &AnyRow) -> StoreResult<StoredServer> {
    let allowed: String = row.try_get("allowed_key_ids")?;
    let tool_count: i64 = row.try_get("tool_count")?;
    Ok(StoredServer {
        server: McpServer {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            name: row.try_get("name")?,
            transport: row.try_get("transport")?,
            url: row.try_get("url")?,
            auth_type: row.try_get("auth_type")?,
            auth_header_name: row.try_get("auth_header_name")?,
            auth_token_hint: row.try_get("auth_token_hint")?,
            allowed_key_ids: serde_json::from_str(&allowed).map_err(|error| sqlx::Error::Decode(Box::new(error)))?,
            tool_count: u32::try_from(tool_count).unwrap_or(u32::MAX),
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            last_discovered_at: row.try_get("last_discovered_at")?,
        },
        sealed: SealedSecret {
            ciphertext: row.try_get("ciphertext")?,
            nonce: row.try_get("nonce")?,
            wrapped_key: row.try_get("wrapped_key")?,
            key_nonce: row.try_get("key_nonce")?,
        },
    })
}

fn approval_from_row(row: &AnyRow) -> StoreResult<Approval> {
    Ok(Approval {
        id: row.try_get("id")?,
        timestamp: row.try_get("created_at")?,
        server_id: row.try_get("server_id")?,
        server_name: row.try_get("server_name")?,
        tool: row.try_get("tool")?,
        arguments_json: row.try_get("arguments")?,
        status: row.try_get("status")?,
        api_key_id: row.try_get("api_key_id")?,
        decided_at: row.try_get("decided_at")?,
        decided_by: row.try_get("decided_by")?,
        result_json: row.try_get("result")?,
        error: row.try_get("error")?,
    })
}
