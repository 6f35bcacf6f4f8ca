//! Every error a client can get, and the one place that maps each to an HTTP status and an
//! OpenAI-shaped body: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something out of range (400).
    #[error("{message}")]
    Invalid {
        /// What is wrong, naming the field.
        message: String,
        /// The offending field (`temperature`, `messages[2].content`), when there is one.
        param: Option<String>,
        /// A machine-readable code (`context_length_exceeded`, `unsupported_parameter`).
        code: Option<&'static str>,
    },
    /// The request names a model this server does not serve (404).
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// No such route (404).
    #[error("Unknown path {0}: see docs/SERVER.md for the endpoints")]
    UnknownPath(String),
    /// The route exists but not for this method (405).
    #[error("Method {0} is not allowed here")]
    MethodNotAllowed(String),
    /// Missing or wrong bearer token (401).
    #[error("Incorrect or missing API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// The request body is over `--max-request-bytes` (413).
    #[error("Request body too large: the limit is {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The client did not send its body in time (408).
    #[error("Timed out reading the request body")]
    BodyTimeout,
    /// The queue is full (429, with `Retry-After`).
    #[error("The server is busy: one generation running and {queued} queued (queue limit {limit}); retry later")]
    QueueFull {
        /// Admitted requests besides the one running or next to run.
        queued: usize,
        /// The queue limit.
        limit: usize,
    },
    /// The engine thread is gone (503).
    #[error("The engine is not running")]
    Unavailable,
    /// The server is stopping (SIGINT or SIGTERM) and takes no more work (503).
    #[error("The server is shutting down and did not start this request; retry when it is back")]
    ShuttingDown,
    /// A bug or a model failure (500).
    #[error("Internal error: {0}")]
    Internal(String),
    /// The grammar engine failed mid-reply: the reply ended early and does not match the
    /// requested format (`response_format`, a required `tool_choice`).
    #[error(
        "The grammar engine failed after {generated} generated tokens, so the reply does not \
         match the requested format (try a simpler or shallower schema): {cause}"
    )]
    GrammarFailed {
        /// The grammar engine's message.
        cause: String,
        /// Tokens generated before the reply was cut.
        generated: usize,
    },
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid { message: message.into(), param: Some(param.into()), code: None }
    }

    /// A 400 refusing a feature sluice does not implement, naming the field.
    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            message: message.into(),
            param: Some(param.into()),
            code: Some("unsupported_parameter"),
        }
    }

    /// The HTTP status of this error (the one mapping).
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Invalid { .. } => StatusCode::BAD_REQUEST,
            Self::ModelNotFound(_) | Self::UnknownPath(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable | Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) | Self::GrammarFailed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error `type`.
    fn kind(&self) -> &'static str {
        match self {
            Self::Unauthorized => "authentication_error",
            Self::QueueFull { .. } => "rate_limit_error",
            Self::Unavailable
            | Self::ShuttingDown
            | Self::Internal(_)
            | Self::GrammarFailed { .. } => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            Self::Invalid { param, .. } => param.as_deref(),
            Self::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    fn code(&self) -> Option<&'static str> {
        match self {
            Self::Invalid { code, .. } => *code,
            Self::ModelNotFound(_) => Some("model_not_found"),
            Self::UnknownPath(_) => Some("unknown_url"),
            Self::Unauthorized => Some("invalid_api_key"),
            Self::PayloadTooLarge { .. } => Some("request_too_large"),
            Self::QueueFull { .. } => Some("queue_full"),
            Self::BodyTimeout => Some("timeout"),
            Self::ShuttingDown => Some("server_shutting_down"),
            Self::GrammarFailed { .. } => Some("grammar_failed"),
            _ => None,
        }
    }

    /// The body: `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.to_string(),
            "type": self.kind(),
            "param": self.param(),
            "code": self.code(),
        }})
    }
}

/// Seconds a client told 429 should wait.
pub const RETRY_AFTER_S: u64 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        let headers = resp.headers_mut();
        match self {
            Self::QueueFull { .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            }
            Self::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_openai_shaped_and_name_the_field() {
        let e = ApiError::unsupported("n", "n must be 1");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body(),
            json!({"error": {"message": "n must be 1", "type": "invalid_request_error",
                   "param": "n", "code": "unsupported_parameter"}})
        );
        let e = ApiError::ModelNotFound("x".into());
        assert_eq!(
            (e.status(), e.body()["error"]["code"].clone()),
            (StatusCode::NOT_FOUND, json!("model_not_found"))
        );
        let full = ApiError::QueueFull { queued: 0, limit: 0 }.into_response();
        assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.headers()[header::RETRY_AFTER], "1");
    }
}
