//! The one error type every service returns, and its lossless mapping to and from gRPC statuses.

use tonic::metadata::MetadataValue;

/// Result of a service call.
pub type ServiceResult<T> = Result<T, ServiceError>;

/// What went wrong, in the terms both gRPC codes and HTTP statuses are derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    Conflict,
    ResourceExhausted,
    Unavailable,
    Internal,
}

/// A service error: its kind, a stable machine-readable reason (for example `key_revoked`) and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    pub kind: ErrorKind,
    pub reason: String,
    pub message: String,
}

const REASON_METADATA_KEY: &str = "x-br-reason";

impl ServiceError {
    /// Builds an error of any kind.
    pub fn new(kind: ErrorKind, reason: impl Into<String>, message: impl Into<String>) -> Self {
        ServiceError { kind, reason: reason.into(), message: message.into() }
    }

    /// The request is malformed or breaks a rule; the caller must change it.
    pub fn invalid(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, reason, message)
    }

    /// The presented credential is missing, unknown, revoked or expired.
    pub fn unauthenticated(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthenticated, reason, message)
    }

    /// The caller is known but not allowed.
    pub fn permission_denied(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, reason, message)
    }

    /// The addressed resource does not exist (for this tenant).
    pub fn not_found(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, reason, message)
    }

    /// The request conflicts with the current state.
    pub fn conflict(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, reason, message)
    }

    /// A dependency (database, another service) cannot be reached.
    pub fn unavailable(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, reason, message)
    }

    /// A bug or an unexpected state; details belong in the logs, not in the message.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, "internal", message)
    }

    fn grpc_code(&self) -> tonic::Code {
        match self.kind {
            ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
            ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::Conflict => tonic::Code::AlreadyExists,
            ErrorKind::ResourceExhausted => tonic::Code::ResourceExhausted,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::Internal => tonic::Code::Internal,
        }
    }
}

impl From<ServiceError> for tonic::Status {
    fn from(error: ServiceError) -> Self {
        let mut status = tonic::Status::new(error.grpc_code(), error.message.clone());
        if let Ok(reason) = MetadataValue::try_from(error.reason.as_str()) {
            status.metadata_mut().insert(REASON_METADATA_KEY, reason);
        }
        status
    }
}

impl From<tonic::Status> for ServiceError {
    fn from(status: tonic::Status) -> Self {
        let kind = match status.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange | tonic::Code::FailedPrecondition => ErrorKind::InvalidArgument,
            tonic::Code::Unauthenticated => ErrorKind::Unauthenticated,
            tonic::Code::PermissionDenied => ErrorKind::PermissionDenied,
            tonic::Code::NotFound => ErrorKind::NotFound,
            tonic::Code::AlreadyExists | tonic::Code::Aborted => ErrorKind::Conflict,
            tonic::Code::ResourceExhausted => ErrorKind::ResourceExhausted,
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => ErrorKind::Unavailable,
            tonic::Code::Ok | tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Unimplemented | tonic::Code::DataLoss => {
                ErrorKind::Internal
            }
        };
        let reason = status.metadata().get(REASON_METADATA_KEY).and_then(|value| value.to_str().ok()).map(str::to_string);
        let reason = match (reason, kind) {
            (Some(reason), _) => reason,
            // No reason travelled: the status came from the transport, not from a service.
            (None, ErrorKind::Unavailable) => "service_unreachable".to_string(),
            (None, _) => "internal".to_string(),
        };
        ServiceError { kind, reason, message: status.message().to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_survives_a_grpc_round_trip() {
        for kind in [
            ErrorKind::InvalidArgument,
            ErrorKind::Unauthenticated,
            ErrorKind::PermissionDenied,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::ResourceExhausted,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
        ] {
            let error = ServiceError::new(kind, "some_reason", "something failed");
            let decoded = ServiceError::from(tonic::Status::from(error.clone()));
            assert_eq!(decoded, error);
        }
    }

    #[test]
    fn a_transport_failure_reads_as_unreachable() {
        let decoded = ServiceError::from(tonic::Status::unavailable("connection refused"));
        assert_eq!(decoded.kind, ErrorKind::Unavailable);
        assert_eq!(decoded.reason, "service_unreachable");
    }
}
