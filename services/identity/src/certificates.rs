//! The record of issued agent certificates (`agent_certificates`, SQLite or PostgreSQL): what a
//! presented certificate is checked against on every use, so an operator or the agent itself can
//! revoke one before it expires. Only metadata is kept: never the certificate or a key.

use brainstorm_common::store::Database;
use brainstorm_proto::ServiceError;
use brainstorm_proto::identity::AgentCertificate;
use sqlx::Row;
use sqlx::any::AnyRow;

const COLUMNS: &str = "serial, tenant_id, agent_id, profile_id, fingerprint_sha256, key_source, not_before, not_after, issued_at, \
                       revoked_at, revoked_reason, revoked_by";
/// States a listing may ask for.
pub const STATUSES: [&str; 3] = ["active", "expired", "revoked"];
/// A listing's size when the request names none, and the most it may ask for.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
pub const MAX_LIST_LIMIT: u32 = 1000;
/// Longest revocation reason, in characters.
const MAX_REASON_CHARS: usize = 256;
/// How long a record stays after its certificate expired (the agent's later issuances remove it).
pub const RETENTION_DAYS: i64 = 30;

/// A certificate's state at `now` (RFC 3339, stored form): `revoked`, `expired` or `active`.
pub fn status(certificate: &AgentCertificate, now: &str) -> &'static str {
    if certificate.revoked_at.is_some() {
        "revoked"
    } else if certificate.not_after.as_str() <= now {
        "expired"
    } else {
        "active"
    }
}

/// `certificate` with its `status` at `now` filled in.
pub fn with_status(mut certificate: AgentCertificate, now: &str) -> AgentCertificate {
    certificate.status = status(&certificate, now).to_string();
    certificate
}

/// A revocation reason: trimmed, printable, at most 256 characters; empty means none.
pub fn validated_reason(reason: Option<&str>) -> Result<Option<String>, ServiceError> {
    crate::agents::bounded_text(reason, MAX_REASON_CHARS)
        .map_err(|()| ServiceError::invalid("invalid_reason", format!("reason must be at most {MAX_REASON_CHARS} printable characters")))
}

/// What a listing selects.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    pub tenant_id: &'a str,
    /// One agent's certificates, of the profile that holds the id now.
    pub agent: Option<(&'a str, &'a str)>,
    pub status: Option<&'a str>,
    pub limit: u32,
    /// Stored form, for the status.
    pub now: &'a str,
}

/// The `agent_certificates` table.
#[derive(Debug, Clone)]
pub struct CertificateStore {
    database: Database,
}

impl CertificateStore {
    /// The table in `database`.
    pub fn new(database: Database) -> Self {
        CertificateStore { database }
    }

    /// Records an issued certificate, and forgets the same agent's certificates that expired before
    /// `prune_before` (the caller's `RETENTION_DAYS` ago).
    pub async fn record(&self, certificate: &AgentCertificate, prune_before: &str) -> Result<(), sqlx::Error> {
        let mut transaction = self.database.begin().await?;
        sqlx::query(&format!("INSERT INTO agent_certificates ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"))
            .bind(&certificate.serial)
            .bind(&certificate.tenant_id)
            .bind(&certificate.agent_id)
            .bind(&certificate.profile_id)
            .bind(&certificate.fingerprint_sha256)
            .bind(&certificate.key_source)
            .bind(&certificate.not_before)
            .bind(&certificate.not_after)
            .bind(&certificate.issued_at)
            .bind(&certificate.revoked_at)
            .bind(&certificate.revoked_reason)
            .bind(&certificate.revoked_by)
            .execute(&mut *transaction)
            .await?;
        sqlx::query("DELETE FROM agent_certificates WHERE tenant_id = $1 AND agent_id = $2 AND not_after < $3")
            .bind(&certificate.tenant_id)
            .bind(&certificate.agent_id)
            .bind(prune_before)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await
    }

    /// One certificate by serial.
    pub async fn get(&self, serial: &str) -> Result<Option<AgentCertificate>, sqlx::Error> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM agent_certificates WHERE serial = $1"))
            .bind(serial)
            .fetch_optional(self.database.pool())
            .await?;
        row.as_ref().map(certificate_of).transpose()
    }

    /// The selected certificates, newest first.
    pub async fn list(&self, selection: Selection<'_>) -> Result<Vec<AgentCertificate>, sqlx::Error> {
        let mut sql = format!("SELECT {COLUMNS} FROM agent_certificates WHERE tenant_id = $1");
        let mut next = 2;
        if selection.agent.is_some() {
            sql.push_str(&format!(" AND agent_id = ${next} AND profile_id = ${}", next + 1));
            next += 2;
        }
        match selection.status {
            Some("revoked") => sql.push_str(" AND revoked_at IS NOT NULL"),
            Some("expired") => sql.push_str(&format!(" AND revoked_at IS NULL AND not_after <= ${next}")),
            Some(_) => sql.push_str(&format!(" AND revoked_at IS NULL AND not_after > ${next}")),
            None => {}
        }
        let bind_now = matches!(selection.status, Some(status) if status != "revoked");
        if bind_now {
            next += 1;
        }
        sql.push_str(&format!(" ORDER BY issued_at DESC, serial LIMIT ${next}"));
        let mut query = sqlx::query(&sql).bind(selection.tenant_id);
        if let Some((agent_id, profile_id)) = selection.agent {
            query = query.bind(agent_id).bind(profile_id);
        }
        if bind_now {
            query = query.bind(selection.now);
        }
        let rows = query.bind(i64::from(selection.limit)).fetch_all(self.database.pool()).await?;
        rows.iter().map(certificate_of).collect()
    }

    /// Marks a certificate revoked unless it already is; false when it was (or is gone).
    pub async fn revoke(&self, serial: &str, at: &str, reason: Option<&str>, by: &str) -> Result<bool, sqlx::Error> {
        let result = sqlx::query(
            "UPDATE agent_certificates SET revoked_at = $1, revoked_reason = $2, revoked_by = $3 WHERE serial = $4 AND revoked_at IS NULL",
        )
        .bind(at)
        .bind(reason)
        .bind(by)
        .bind(serial)
        .execute(self.database.pool())
        .await?;
        Ok(result.rows_affected() == 1)
    }
}

fn certificate_of(row: &AnyRow) -> Result<AgentCertificate, sqlx::Error> {
    Ok(AgentCertificate {
        serial: row.try_get("serial")?,
        tenant_id: row.try_get("tenant_id")?,
        agent_id: row.try_get("agent_id")?,
        profile_id: row.try_get("profile_id")?,
        fingerprint_sha256: row.try_get("fingerprint_sha256")?,
        key_source: row.try_get("key_source")?,
        not_before: row.try_get("not_before")?,
        not_after: row.try_get("not_after")?,
        issued_at: row.try_get("issued_at")?,
        revoked_at: row.try_get("revoked_at")?,
        revoked_reason: row.try_get("revoked_reason")?,
        revoked_by: row.try_get("revoked_by")?,
        status: String::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(not_after: &str, revoked_at: Option<&str>) -> AgentCertificate {
        AgentCertificate { not_after: not_after.to_string(), revoked_at: revoked_at.map(str::to_string), ..AgentCertificate::default() }
    }

    #[test]
    fn a_certificate_is_revoked_before_it_is_expired() {
        let now = "2026-06-01T00:00:00.000Z";
        assert_eq!(status(&certificate("2026-06-02T00:00:00.000Z", None), now), "active");
        assert_eq!(status(&certificate(now, None), now), "expired");
        assert_eq!(status(&certificate("2026-05-01T00:00:00.000Z", Some("2026-04-01T00:00:00.000Z")), now), "revoked");
        assert_eq!(status(&certificate("2026-07-01T00:00:00.000Z", Some("2026-05-01T00:00:00.000Z")), now), "revoked");
    }

    #[test]
    fn reasons_are_short_printable_text() {
        assert_eq!(validated_reason(None).unwrap(), None);
        assert_eq!(validated_reason(Some("  ")).unwrap(), None);
        assert_eq!(validated_reason(Some(" key leaked ")).unwrap().as_deref(), Some("key leaked"));
        assert!(validated_reason(Some("line\nbreak")).is_err());
        assert!(validated_reason(Some(&"x".repeat(257))).is_err());
        assert!(validated_reason(Some(&"é".repeat(256))).unwrap().is_some());
    }
}
