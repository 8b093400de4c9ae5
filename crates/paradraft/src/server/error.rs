//! The API's error: the OpenAI shape, its HTTP status and the field it names.

use serde_json::Value;

/// An error in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}` with its
/// HTTP status.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<std::borrow::Cow<'static, str>>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(Into::into),
            code: None,
        }
    }

    /// The field the error names, when it is only known at run time.
    pub fn param_named(mut self, field: String) -> Self {
        self.param = Some(field.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    pub fn kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    pub fn body(&self) -> Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}
