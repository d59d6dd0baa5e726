//! Outgoing mail written to a directory, one JSON file per message, instead of being sent.

use std::path::PathBuf;

use serde::Serialize;

/// A message to deliver.
#[derive(Debug, Clone, Serialize)]
pub struct Mail {
    pub to: String,
    pub subject: String,
    pub body: String,
}

/// Why a message could not be written.
#[derive(Debug, thiserror::Error)]
#[error("could not write mail to the outbox: {0}")]
pub struct OutboxError(#[from] std::io::Error);

/// A directory where each outgoing message becomes one file.
#[derive(Debug, Clone)]
pub struct MailOutbox {
    directory: PathBuf,
}

impl MailOutbox {
    /// An outbox writing into `directory` (created on first use).
    pub fn new(directory: impl Into<PathBuf>) -> Self {
        MailOutbox { directory: directory.into() }
    }

    /// Writes the message atomically (temporary file, then rename) and returns its path.
    pub async fn deliver(&self, mail: &Mail) -> Result<PathBuf, OutboxError> {
        tokio::fs::create_dir_all(&self.directory).await?;
        let created_at = crate::time::now_timestamp();
        let file_stem = format!("{}-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%3f"), uuid::Uuid::new_v4().simple());
        let payload = serde_json::json!({
            "to": mail.to,
            "subject": mail.subject,
            "body": mail.body,
            "created_at": created_at,
        });
        let bytes = serde_json::to_vec_pretty(&payload).map_err(std::io::Error::other)?;
        let temporary = self.directory.join(format!(".{file_stem}.tmp"));
        let final_path = self.directory.join(format!("{file_stem}.json"));
        tokio::fs::write(&temporary, bytes).await?;
        tokio::fs::rename(&temporary, &final_path).await?;
        tracing::info!(to = %mail.to, subject = %mail.subject, path = %final_path.display(), "mail written to outbox");
        Ok(final_path)
    }
}
