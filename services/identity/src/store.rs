//! Identity's tables, read and written with bound parameters on SQLite or PostgreSQL.

use brainstorm_common::store::Database;
use brainstorm_proto::identity::{ApiKey, InviteCode, OAuthApp, Tenant, User};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

/// Result of a store operation.
pub type StoreResult<T> = Result<T, sqlx::Error>;

/// A stored claim token.
#[derive(Debug, Clone)]
pub struct ClaimTokenRecord {
    pub id: String,
    pub tenant_id: String,
    pub token_hash: String,
    pub role: String,
    pub max_uses: i64,
    pub purpose: String,
    pub email: Option<String>,
    pub expires_at: String,
    pub created_at: String,
    pub created_by: Option<String>,
}

/// A stored API key with its hash.
pub struct ApiKeyRecord<'a> {
    pub key: &'a ApiKey,
    pub key_hash: &'a str,
}

/// A pending email verification: the digest of the mailed code, never the code.
#[derive(Debug, Clone)]
pub struct EmailVerificationRecord {
    pub tenant_id: String,
    pub email: String,
    pub code_hash: String,
    /// Confirmations tried against this code, the successful one included.
    pub attempts: i64,
    pub expires_at: String,
    pub created_at: String,
}

/// Identity's store.
#[derive(Debug, Clone)]
pub struct IdentityStore {
    database: Database,
}

const TENANT_COLUMNS: &str = "t.id, t.slug, t.name, t.plan, t.status, t.created_at, t.updated_at, t.email_verified_at, t.graduated_at, \
     (SELECT COUNT(*) FROM users u WHERE u.tenant_id = t.id) AS user_count";
const API_KEY_COLUMNS: &str = "id, tenant_id, name, prefix, role, scopes, budget_limit_nanos, budget_period, \
     rate_limit_rpm, expires_at, allowed_models, created_at, revoked_at, created_by";

impl IdentityStore {
    pub fn new(database: Database) -> Self {
        IdentityStore { database }
    }

    pub async fn begin(&self) -> StoreResult<Transaction<'static, Any>> {
        self.database.begin().await
    }

    pub async fn insert_tenant(transaction: &mut Transaction<'static, Any>, tenant: &Tenant) -> StoreResult<()> {
        sqlx::query("INSERT INTO tenants (id, slug, name, plan, status, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(&tenant.id)
            .bind(&tenant.slug)
            .bind(&tenant.name)
            .bind(&tenant.plan)
            .bind(&tenant.status)
            .bind(&tenant.created_at)
            .bind(&tenant.updated_at)
            .execute(&mut **transaction)
            .await?;
        Ok(())
    }

    pub async fn insert_api_key(transaction: &mut Transaction<'static, Any>, record: ApiKeyRecord<'_>) -> StoreResult<()> {
        let key = record.key;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, name, key_hash, prefix, role, scopes, budget_limit_nanos, budget_period, \
             rate_limit_rpm, expires_at, allowed_models, created_at, revoked_at, created_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(&key.id)
        .bind(&key.tenant_id)
        .bind(&key.name)
        .bind(record.key_hash)
        .bind(&key.prefix)
        .bind(&key.role)
        .bind(json_list(&key.scopes))
        .bind(key.budget_limit_nanos)
        .bind(key.budget_period.clone())
        .bind(key.rate_limit_rpm.map(i64::from))
        .bind(key.expires_at.clone())
        .bind(json_list(&key.allowed_models))
        .bind(&key.created_at)
        .bind(key.revoked_at.clone())
        .bind(key.created_by.clone())
        .execute(&mut **transaction)
        .await?;
        Ok(())
    }

    pub async fn insert_claim_token(transaction: &mut Transaction<'static, Any>, token: &ClaimTokenRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO claim_tokens (id, tenant_id, token_hash, role, max_uses, uses, purpose, email, expires_at, created_at, created_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&token.id)
        .bind(&token.tenant_id)
        .bind(&token.token_hash)
        .bind(&token.role)
        .bind(token.max_uses)
        .bind(0_i64)
        .bind(&token.purpose)
        .bind(token.email.clone())
        .bind(&token.expires_at)
        .bind(&token.created_at)
        .bind(token.created_by.clone())
        .execute(&mut **transaction)
        .await?;
        Ok(())
    }

    pub async fn insert_user(transaction: &mut Transaction<'static, Any>, user: &User) -> StoreResult<()> {
        sqlx::query("INSERT INTO users (id, tenant_id, email, role, status, created_at) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(&user.id)
            .bind(&user.tenant_id)
            .bind(&user.email)
            .bind(&user.role)
            .bind(&user.status)
            .bind(&user.created_at)
            .execute(&mut **transaction)
            .await?;
        Ok(())
    }

    /// Counts one use of an invite code if it is still usable at `now`; false when it is not.
    pub async fn consume_invite_code(transaction: &mut Transaction<'static, Any>, code: &str, now: &str) -> StoreResult<bool> {
        let result = sqlx::query(
            "UPDATE invite_codes SET uses = uses + 1 WHERE code = $1 \
             AND (max_uses IS NULL OR uses < max_uses) AND (expires_at IS NULL OR expires_at > $2)",
        )
        .bind(code)
        .bind(now)
        .execute(&mut **transaction)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn tenant(&self, tenant_id: &str) -> StoreResult<Option<Tenant>> {
        let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants t WHERE t.id = $1");
        let row = sqlx::query(&sql).bind(tenant_id).fetch_optional(self.database.pool()).await?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    pub async fn tenants(&self, status: Option<&str>) -> StoreResult<Vec<Tenant>> {
        let sql = format!("SELECT {TENANT_COLUMNS} FROM tenants t WHERE ($1 IS NULL OR t.status = $1) ORDER BY t.created_at, t.id");
        let rows = sqlx::query(&sql).bind(status.map(str::to_string)).fetch_all(self.database.pool()).await?;
        rows.iter().map(tenant_from_row).collect()
    }

    pub async fn rename_tenant(&self, tenant_id: &str, name: &str, now: &str) -> StoreResult<bool> {
        let result = sqlx::query("UPDATE tenants SET name = $1, updated_at = $2 WHERE id = $3")
            .bind(name)
            .bind(now)
            .bind(tenant_id)
            .execute(self.database.pool())
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Sets a tenant's status and returns the one it had (None: no such tenant). The row is locked
    /// first (a write that changes nothing: PostgreSQL's row lock, SQLite's write lock), then read
    /// and updated in the same transaction, so of two concurrent calls the second sees the first's
    /// status.
    pub async fn set_tenant_status(&self, tenant_id: &str, status: &str, now: &str) -> StoreResult<Option<String>> {
        let mut transaction = self.begin().await?;
        let locked = sqlx::query("UPDATE tenants SET status = status WHERE id = $1").bind(tenant_id).execute(&mut *transaction).await?;
        if locked.rows_affected() != 1 {
            return Ok(None);
        }
        let previous: String =
            sqlx::query("SELECT status FROM tenants WHERE id = $1").bind(tenant_id).fetch_one(&mut *transaction).await?.try_get(0)?;
        if previous != status {
            sqlx::query("UPDATE tenants SET status = $1, updated_at = $2 WHERE id = $3")
                .bind(status)
                .bind(now)
                .bind(tenant_id)
                .execute(&mut *transaction)
                .await?;
        }
        transaction.commit().await?;
        Ok(Some(previous))
    }

    /// Moves a tenant to `plan` unless it is already on it; true when this call changed the plan.
    /// `graduated_at` follows the plan: set to `now` on the move to `standard`, cleared on leaving it.
    pub async fn set_tenant_plan(transaction: &mut Transaction<'static, Any>, tenant_id: &str, plan: &str, now: &str) -> StoreResult<bool> {
        let graduated_at = (plan == STANDARD_PLAN).then(|| now.to_string());
        let result = sqlx::query("UPDATE tenants SET plan = $1, graduated_at = $2, updated_at = $3 WHERE id = $4 AND plan <> $1")
            .bind(plan)
            .bind(graduated_at)
            .bind(now)
            .bind(tenant_id)
            .execute(&mut **transaction)
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Records that the tenant proved control of `email` at `now`; false when the tenant does not exist.
    pub async fn mark_email_verified(
        transaction: &mut Transaction<'static, Any>,
        tenant_id: &str,
        email: &str,
        now: &str,
    ) -> StoreResult<bool> {
        let result = sqlx::query("UPDATE tenants SET verified_email = $1, email_verified_at = $2, updated_at = $2 WHERE id = $3")
            .bind(email)
            .bind(now)
            .bind(tenant_id)
            .execute(&mut **transaction)
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Stores the tenant's pending verification, replacing any earlier one (and its attempt count).
    pub async fn replace_email_verification(&self, record: &EmailVerificationRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO email_verifications (tenant_id, email, code_hash, attempts, expires_at, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (tenant_id) DO UPDATE SET email = excluded.email, code_hash = excluded.code_hash, \
             attempts = excluded.attempts, expires_at = excluded.expires_at, created_at = excluded.created_at",
        )
        .bind(&record.tenant_id)
        .bind(&record.email)
        .bind(&record.code_hash)
        .bind(record.attempts)
        .bind(&record.expires_at)
        .bind(&record.created_at)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    /// Counts one confirmation attempt against the tenant's pending code if it is unexpired at `now`
    /// and has attempts left; false otherwise. The row stays locked until the transaction ends, so
    /// concurrent confirmations are serialised and never exceed `max_attempts` between them.
    pub async fn count_verification_attempt(
        transaction: &mut Transaction<'static, Any>,
        tenant_id: &str,
        max_attempts: i64,
        now: &str,
    ) -> StoreResult<bool> {
        let result = sqlx::query(
            "UPDATE email_verifications SET attempts = attempts + 1 WHERE tenant_id = $1 AND attempts < $2 AND expires_at > $3",
        )
        .bind(tenant_id)
        .bind(max_attempts)
        .bind(now)
        .execute(&mut **transaction)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// The tenant's pending verification, if any.
    pub async fn email_verification(
        transaction: &mut Transaction<'static, Any>,
        tenant_id: &str,
    ) -> StoreResult<Option<EmailVerificationRecord>> {
        let row = sqlx::query(
            "SELECT tenant_id, email, code_hash, attempts, expires_at, created_at FROM email_verifications WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .fetch_optional(&mut **transaction)
        .await?;
        row.map(|row| {
            Ok(EmailVerificationRecord {
                tenant_id: row.try_get("tenant_id")?,
                email: row.try_get("email")?,
                code_hash: row.try_get("code_hash")?,
                attempts: row.try_get("attempts")?,
                expires_at: row.try_get("expires_at")?,
                created_at: row.try_get("created_at")?,
            })
        })
        .transpose()
    }

    /// Deletes the tenant's pending verification if it still holds `code_hash`; true when this call
    /// consumed it, so a code is consumed at most once.
    pub async fn consume_email_verification(
        transaction: &mut Transaction<'static, Any>,
        tenant_id: &str,
        code_hash: &str,
    ) -> StoreResult<bool> {
        let result = sqlx::query("DELETE FROM email_verifications WHERE tenant_id = $1 AND code_hash = $2")
            .bind(tenant_id)
            .bind(code_hash)
            .execute(&mut **transaction)
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// The key with this hash and its tenant, revoked or not.
    pub async fn api_key_by_hash(&self, key_hash: &str) -> StoreResult<Option<ApiKey>> {
        let sql = format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE key_hash = $1");
        let row = sqlx::query(&sql).bind(key_hash).fetch_optional(self.database.pool()).await?;
        row.as_ref().map(api_key_from_row).transpose()
    }

    pub async fn api_key(&self, tenant_id: &str, key_id: &str) -> StoreResult<Option<ApiKey>> {
        let sql = format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 AND id = $2");
        let row = sqlx::query(&sql).bind(tenant_id).bind(key_id).fetch_optional(self.database.pool()).await?;
        row.as_ref().map(api_key_from_row).transpose()
    }

    pub async fn api_keys(&self, tenant_id: &str) -> StoreResult<Vec<ApiKey>> {
        let sql = format!("SELECT {API_KEY_COLUMNS} FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id");
        let rows = sqlx::query(&sql).bind(tenant_id).fetch_all(self.database.pool()).await?;
        rows.iter().map(api_key_from_row).collect()
    }

    /// Marks a key revoked unless it already is; true when this call revoked it.
    pub async fn revoke_api_key(&self, tenant_id: &str, key_id: &str, now: &str) -> StoreResult<bool> {
        let result = sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE tenant_id = $2 AND id = $3 AND revoked_at IS NULL")
            .bind(now)
            .bind(tenant_id)
            .bind(key_id)
            .execute(self.database.pool())
            .await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn users(&self, tenant_id: &str) -> StoreResult<Vec<User>> {
        let rows =
            sqlx::query("SELECT id, tenant_id, email, role, status, created_at FROM users WHERE tenant_id = $1 ORDER BY created_at, id")
                .bind(tenant_id)
                .fetch_all(self.database.pool())
                .await?;
        rows.iter().map(user_from_row).collect()
    }

    pub async fn user(&self, tenant_id: &str, user_id: &str) -> StoreResult<Option<User>> {
        let row = sqlx::query("SELECT id, tenant_id, email, role, status, created_at FROM users WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(user_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// Deletes a user and the invitations sent to it; true when the user existed.
    pub async fn delete_user(&self, user: &User) -> StoreResult<bool> {
        let mut transaction = self.begin().await?;
        sqlx::query("DELETE FROM claim_tokens WHERE tenant_id = $1 AND purpose = $2 AND email = $3")
            .bind(&user.tenant_id)
            .bind("invitation")
            .bind(&user.email)
            .execute(&mut *transaction)
            .await?;
        let result = sqlx::query("DELETE FROM users WHERE tenant_id = $1 AND id = $2")
            .bind(&user.tenant_id)
            .bind(&user.id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(result.rows_affected() == 1)
    }

    pub async fn insert_invite_code(&self, invite_code: &InviteCode) -> StoreResult<()> {
        sqlx::query("INSERT INTO invite_codes (id, code, max_uses, uses, expires_at, created_at) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(&invite_code.id)
            .bind(&invite_code.code)
            .bind(invite_code.max_uses.map(i64::from))
            .bind(i64::from(invite_code.uses))
            .bind(invite_code.expires_at.clone())
            .bind(&invite_code.created_at)
            .execute(self.database.pool())
            .await?;
        Ok(())
    }

    pub async fn invite_codes(&self) -> StoreResult<Vec<InviteCode>> {
        let rows = sqlx::query("SELECT id, code, max_uses, uses, expires_at, created_at FROM invite_codes ORDER BY created_at, id")
            .fetch_all(self.database.pool())
            .await?;
        rows.iter()
            .map(|row| {
                Ok(InviteCode {
                    id: row.try_get("id")?,
                    code: row.try_get("code")?,
                    max_uses: row.try_get::<Option<i64>, _>("max_uses")?.map(clamp_u32),
                    uses: clamp_u32(row.try_get("uses")?),
                    expires_at: row.try_get("expires_at")?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect()
    }

    pub async fn delete_invite_code(&self, id: &str) -> StoreResult<bool> {
        let result = sqlx::query("DELETE FROM invite_codes WHERE id = $1").bind(id).execute(self.database.pool()).await?;
        Ok(result.rows_affected() == 1)
    }

    /// `SELECT COUNT(*) ...` with text parameters.
    pub async fn count(&self, sql: &str, parameters: &[&str]) -> StoreResult<u64> {
        let mut query = sqlx::query_scalar::<_, i64>(sql);
        for parameter in parameters {
            query = query.bind(parameter.to_string());
        }
        Ok(u64::try_from(query.fetch_one(self.database.pool()).await?).unwrap_or(0))
    }

    /// `SELECT <column>, COUNT(*) FROM tenants GROUP BY <column>` for a fixed column name.
    pub async fn tenant_counts_by(&self, column: TenantGrouping) -> StoreResult<Vec<(String, u64)>> {
        let sql = match column {
            TenantGrouping::Status => "SELECT status, COUNT(*) FROM tenants GROUP BY status",
            TenantGrouping::Plan => "SELECT plan, COUNT(*) FROM tenants GROUP BY plan",
        };
        let rows = sqlx::query(sql).fetch_all(self.database.pool()).await?;
        rows.iter().map(|row| Ok((row.try_get::<String, _>(0)?, u64::try_from(row.try_get::<i64, _>(1)?).unwrap_or(0)))).collect()
    }
}

/// Columns the digest groups tenants by.
#[derive(Debug, Clone, Copy)]
pub enum TenantGrouping {
    Status,
    Plan,
}

/// A claim token being redeemed: what the redemption needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimTokenRow {
    pub id: String,
    pub tenant_id: String,
    pub role: String,
    pub max_uses: i64,
    pub uses: i64,
    pub expires_at: String,
}

/// An identity's membership of a tenant, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipRow {
    pub tenant_id: String,
    pub user_id: String,
    pub claim_role: String,
    pub email: String,
    pub claimed_at: String,
}

/// A device authorization, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceRow {
    pub device_code_hash: String,
    pub user_code: String,
    pub client_name: String,
    /// `pending`, `confirmed` or `delivered`.
    pub status: String,
    pub tenant_id: Option<String>,
    pub issuer: Option<String>,
    pub subject: Option<String>,
    pub role: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub confirmed_at: Option<String>,
    pub last_polled_at: Option<String>,
}

const DEVICE_COLUMNS: &str = "device_code_hash, user_code, client_name, status, tenant_id, issuer, subject, role, created_at, expires_at, \
     confirmed_at, last_polled_at";

impl IdentityStore {
    /// A claim token by its digest, read inside the redemption's transaction.
    pub async fn claim_token(transaction: &mut Transaction<'static, Any>, token_hash: &str) -> StoreResult<Option<ClaimTokenRow>> {
        let row = sqlx::query("SELECT id, tenant_id, role, max_uses, uses, expires_at FROM claim_tokens WHERE token_hash = $1")
            .bind(token_hash)
            .fetch_optional(&mut **transaction)
            .await?;
        row.map(|row| {
            Ok(ClaimTokenRow {
                id: row.try_get("id")?,
                tenant_id: row.try_get("tenant_id")?,
                role: row.try_get("role")?,
                max_uses: row.try_get("max_uses")?,
                uses: row.try_get("uses")?,
                expires_at: row.try_get("expires_at")?,
            })
        })
        .transpose()
    }

    /// Counts one use of a claim token if it is still usable at `now`; false when it is not.
    pub async fn use_claim_token(transaction: &mut Transaction<'static, Any>, id: &str, now: &str) -> StoreResult<bool> {
        let used = sqlx::query("UPDATE claim_tokens SET uses = uses + 1 WHERE id = $1 AND uses < max_uses AND expires_at > $2")
            .bind(id)
            .bind(now)
            .execute(&mut **transaction)
            .await?;
        Ok(used.rows_affected() == 1)
    }

    /// The user of `email` in a tenant, if any.
    pub async fn user_by_email(transaction: &mut Transaction<'static, Any>, tenant_id: &str, email: &str) -> StoreResult<Option<User>> {
        let row = sqlx::query("SELECT id, tenant_id, email, role, status, created_at FROM users WHERE tenant_id = $1 AND email = $2")
            .bind(tenant_id)
            .bind(email)
            .fetch_optional(&mut **transaction)
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    /// An invited user who claimed their invitation becomes active.
    pub async fn activate_user(transaction: &mut Transaction<'static, Any>, user_id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE users SET status = 'active' WHERE id = $1 AND status = 'invited'")
            .bind(user_id)
            .execute(&mut **transaction)
            .await?;
        Ok(())
    }

    /// Stores a membership; false when the identity already holds one in that tenant.
    pub async fn insert_membership(
        transaction: &mut Transaction<'static, Any>,
        issuer: &str,
        subject: &str,
        membership: &MembershipRow,
    ) -> StoreResult<bool> {
        let inserted = sqlx::query(
            "INSERT INTO idp_memberships (issuer, subject, tenant_id, user_id, claim_role, email, claimed_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (issuer, subject, tenant_id) DO NOTHING",
        )
        .bind(issuer)
        .bind(subject)
        .bind(&membership.tenant_id)
        .bind(&membership.user_id)
        .bind(&membership.claim_role)
        .bind(&membership.email)
        .bind(&membership.claimed_at)
        .execute(&mut **transaction)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    /// Records `tenant_id` as the tenant the identity provisioned; false (and nothing written) when it
    /// has one already.
    pub async fn insert_provision(
        transaction: &mut Transaction<'static, Any>,
        issuer: &str,
        subject: &str,
        tenant_id: &str,
        created_at: &str,
    ) -> StoreResult<bool> {
        let inserted = sqlx::query(
            "INSERT INTO idp_provisions (issuer, subject, tenant_id, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (issuer, subject) DO NOTHING",
        )
        .bind(issuer)
        .bind(subject)
        .bind(tenant_id)
        .bind(created_at)
        .execute(&mut **transaction)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    /// The tenant the identity provisioned, if it did.
    pub async fn provisioned_tenant(&self, issuer: &str, subject: &str) -> StoreResult<Option<String>> {
        let row = sqlx::query("SELECT tenant_id FROM idp_provisions WHERE issuer = $1 AND subject = $2")
            .bind(issuer)
            .bind(subject)
            .fetch_optional(self.database.pool())
            .await?;
        row.map(|row| row.try_get("tenant_id")).transpose()
    }

    /// An identity's memberships, oldest first.
    pub async fn memberships(&self, issuer: &str, subject: &str) -> StoreResult<Vec<MembershipRow>> {
        let rows = sqlx::query(
            "SELECT tenant_id, user_id, claim_role, email, claimed_at FROM idp_memberships WHERE issuer = $1 AND subject = $2 \
             ORDER BY claimed_at, tenant_id",
        )
        .bind(issuer)
        .bind(subject)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(MembershipRow {
                    tenant_id: row.try_get("tenant_id")?,
                    user_id: row.try_get("user_id")?,
                    claim_role: row.try_get("claim_role")?,
                    email: row.try_get("email")?,
                    claimed_at: row.try_get("claimed_at")?,
                })
            })
            .collect()
    }

    /// Stores a new device authorization; false when its user code is taken (draw another).
    pub async fn insert_device(&self, device: &DeviceRow) -> StoreResult<bool> {
        let inserted = sqlx::query(
            "INSERT INTO device_authorizations (device_code_hash, user_code, client_name, status, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(&device.device_code_hash)
        .bind(&device.user_code)
        .bind(&device.client_name)
        .bind(&device.status)
        .bind(&device.created_at)
        .bind(&device.expires_at)
        .execute(self.database.pool())
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    /// A device authorization by its user code or by its device code's digest.
    pub async fn device(&self, by_user_code: Option<&str>, by_hash: Option<&str>) -> StoreResult<Option<DeviceRow>> {
        let row = sqlx::query(&format!("SELECT {DEVICE_COLUMNS} FROM device_authorizations WHERE user_code = $1 OR device_code_hash = $2"))
            .bind(by_user_code.unwrap_or_default())
            .bind(by_hash.unwrap_or_default())
            .fetch_optional(self.database.pool())
            .await?;
        row.map(|row| {
            Ok(DeviceRow {
                device_code_hash: row.try_get("device_code_hash")?,
                user_code: row.try_get("user_code")?,
                client_name: row.try_get("client_name")?,
                status: row.try_get("status")?,
                tenant_id: row.try_get("tenant_id")?,
                issuer: row.try_get("issuer")?,
                subject: row.try_get("subject")?,
                role: row.try_get("role")?,
                created_at: row.try_get("created_at")?,
                expires_at: row.try_get("expires_at")?,
                confirmed_at: row.try_get("confirmed_at")?,
                last_polled_at: row.try_get("last_polled_at")?,
            })
        })
        .transpose()
    }

    /// Confirms a pending, unexpired device authorization for a tenant; false otherwise.
    pub async fn confirm_device(&self, user_code: &str, confirmed: &DeviceRow, now: &str) -> StoreResult<bool> {
        let changed = sqlx::query(
            "UPDATE device_authorizations SET status = 'confirmed', tenant_id = $1, issuer = $2, subject = $3, role = $4, \
             confirmed_at = $5 WHERE user_code = $6 AND status = 'pending' AND expires_at > $5",
        )
        .bind(confirmed.tenant_id.clone())
        .bind(confirmed.issuer.clone())
        .bind(confirmed.subject.clone())
        .bind(confirmed.role.clone())
        .bind(now)
        .bind(user_code)
        .execute(self.database.pool())
        .await?;
        Ok(changed.rows_affected() == 1)
    }

    /// Notes a poll; the time of the previous one, if any.
    pub async fn note_device_poll(&self, device_code_hash: &str, now: &str) -> StoreResult<()> {
        sqlx::query("UPDATE device_authorizations SET last_polled_at = $1 WHERE device_code_hash = $2")
            .bind(now)
            .bind(device_code_hash)
            .execute(self.database.pool())
            .await?;
        Ok(())
    }

    /// Marks a confirmed device authorization delivered (its key handed out); false when another
    /// poll did it first.
    pub async fn deliver_device(&self, device_code_hash: &str) -> StoreResult<bool> {
        let changed =
            sqlx::query("UPDATE device_authorizations SET status = 'delivered' WHERE device_code_hash = $1 AND status = 'confirmed'")
                .bind(device_code_hash)
                .execute(self.database.pool())
                .await?;
        Ok(changed.rows_affected() == 1)
    }
}

fn tenant_from_row(row: &AnyRow) -> StoreResult<Tenant> {
    let plan: String = row.try_get("plan")?;
    Ok(Tenant {
        id: row.try_get("id")?,
        slug: row.try_get("slug")?,
        name: row.try_get("name")?,
        tier: tier_of_plan(&plan).to_string(),
        plan,
        status: row.try_get("status")?,
        user_count: u64::try_from(row.try_get::<i64, _>("user_count")?).unwrap_or(0),
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        email_verified_at: row.try_get("email_verified_at")?,
        graduated_at: row.try_get("graduated_at")?,
    })
}

/// The plan every tenant starts on.
pub const SANDBOX_PLAN: &str = "sandbox";
/// The plan a tenant graduates to.
pub const STANDARD_PLAN: &str = "standard";
/// Every plan a tenant can be on.
pub const PLANS: [&str; 2] = [SANDBOX_PLAN, STANDARD_PLAN];

/// The tier a plan is reported as: plan `sandbox` is tier `community`.
pub fn tier_of_plan(plan: &str) -> &str {
    if plan == SANDBOX_PLAN { "community" } else { plan }
}

fn api_key_from_row(row: &AnyRow) -> StoreResult<ApiKey> {
    Ok(ApiKey {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        name: row.try_get("name")?,
        prefix: row.try_get("prefix")?,
        role: row.try_get("role")?,
        scopes: parse_json_list(&row.try_get::<String, _>("scopes")?),
        budget_limit_nanos: row.try_get("budget_limit_nanos")?,
        budget_period: row.try_get("budget_period")?,
        rate_limit_rpm: row.try_get::<Option<i64>, _>("rate_limit_rpm")?.map(clamp_u32),
        expires_at: row.try_get("expires_at")?,
        allowed_models: parse_json_list(&row.try_get::<String, _>("allowed_models")?),
        created_at: row.try_get("created_at")?,
        revoked_at: row.try_get("revoked_at")?,
        created_by: row.try_get("created_by")?,
    })
}

fn user_from_row(row: &AnyRow) -> StoreResult<User> {
    Ok(User {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        email: row.try_get("email")?,
        role: row.try_get("role")?,
        status: row.try_get("status")?,
        created_at: row.try_get("created_at")?,
    })
}

/// An authorization code as stored (its digest, never the code).
#[derive(Debug, Clone)]
pub struct OAuthCodeRecord {
    pub code_hash: String,
    pub client_id: String,
    pub tenant_id: String,
    pub redirect_uri: String,
    pub code_challenge: String,
    pub scopes: Vec<String>,
    pub permissions: Vec<String>,
    pub authorized_by: String,
    pub created_at: String,
    pub expires_at: String,
}

impl IdentityStore {
    pub async fn insert_oauth_app(&self, app: &OAuthApp, created_by: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO oauth_apps (client_id, tenant_id, name, callback_urls, scopes, created_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&app.client_id)
        .bind(&app.tenant_id)
        .bind(&app.name)
        .bind(json_list(&app.callback_urls))
        .bind(json_list(&app.scopes))
        .bind(created_by)
        .bind(&app.created_at)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    /// The app with this client id, whichever tenant registered it.
    pub async fn oauth_app(&self, client_id: &str) -> StoreResult<Option<OAuthApp>> {
        let row = sqlx::query("SELECT client_id, tenant_id, name, callback_urls, scopes, created_at FROM oauth_apps WHERE client_id = $1")
            .bind(client_id)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(oauth_app_from_row).transpose()
    }

    /// The tenant's apps, oldest first.
    pub async fn oauth_apps(&self, tenant_id: &str) -> StoreResult<Vec<OAuthApp>> {
        let rows = sqlx::query(
            "SELECT client_id, tenant_id, name, callback_urls, scopes, created_at FROM oauth_apps WHERE tenant_id = $1 ORDER BY created_at, client_id",
        )
        .bind(tenant_id)
        .fetch_all(self.database.pool())
        .await?;
        rows.iter().map(oauth_app_from_row).collect()
    }

    /// Deletes the tenant's app and its unredeemed codes; false when the tenant has no such app.
    pub async fn delete_oauth_app(&self, tenant_id: &str, client_id: &str) -> StoreResult<bool> {
        let mut transaction = self.begin().await?;
        let deleted = sqlx::query("DELETE FROM oauth_apps WHERE tenant_id = $1 AND client_id = $2")
            .bind(tenant_id)
            .bind(client_id)
            .execute(&mut *transaction)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM oauth_codes WHERE client_id = $1 AND redeemed_at IS NULL")
            .bind(client_id)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(deleted > 0)
    }

    pub async fn insert_oauth_code(&self, code: &OAuthCodeRecord) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO oauth_codes (code_hash, client_id, tenant_id, redirect_uri, code_challenge, scopes, permissions, authorized_by, \
             created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&code.code_hash)
        .bind(&code.client_id)
        .bind(&code.tenant_id)
        .bind(&code.redirect_uri)
        .bind(&code.code_challenge)
        .bind(json_list(&code.scopes))
        .bind(json_list(&code.permissions))
        .bind(&code.authorized_by)
        .bind(&code.created_at)
        .bind(&code.expires_at)
        .execute(self.database.pool())
        .await?;
        Ok(())
    }

    /// Takes an unredeemed, unexpired code once: of two redemptions racing, one gets the record.
    pub async fn redeem_oauth_code(&self, code_hash: &str, now: &str) -> StoreResult<Option<OAuthCodeRecord>> {
        let taken = sqlx::query(
            "UPDATE oauth_codes SET redeemed_at = $2 WHERE code_hash = $1 AND redeemed_at IS NULL AND expires_at > $2 \
             RETURNING client_id, tenant_id, redirect_uri, code_challenge, scopes, permissions, authorized_by, created_at, expires_at",
        )
        .bind(code_hash)
        .bind(now)
        .fetch_optional(self.database.pool())
        .await?;
        let Some(row) = taken else { return Ok(None) };
        Ok(Some(OAuthCodeRecord {
            code_hash: code_hash.to_string(),
            client_id: row.try_get("client_id")?,
            tenant_id: row.try_get("tenant_id")?,
            redirect_uri: row.try_get("redirect_uri")?,
            code_challenge: row.try_get("code_challenge")?,
            scopes: parse_json_list(&row.try_get::<String, _>("scopes")?),
            permissions: parse_json_list(&row.try_get::<String, _>("permissions")?),
            authorized_by: row.try_get("authorized_by")?,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
        }))
    }
}

fn oauth_app_from_row(row: &AnyRow) -> StoreResult<OAuthApp> {
    Ok(OAuthApp {
        client_id: row.try_get("client_id")?,
        tenant_id: row.try_get("tenant_id")?,
        name: row.try_get("name")?,
        callback_urls: parse_json_list(&row.try_get::<String, _>("callback_urls")?),
        scopes: parse_json_list(&row.try_get::<String, _>("scopes")?),
        created_at: row.try_get("created_at")?,
    })
}

fn json_list(items: &[String]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_string())
}

fn parse_json_list(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_default()
}

fn clamp_u32(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}
