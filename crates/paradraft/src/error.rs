//! One error type for the library: every bad input maps to a variant with a clear message.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The reason is part of the message (not a separate error source, which reporters
    /// would print a second time).
    #[error("I/O error on {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("model file {path} is not a valid {format} file: {reason}")]
    BadModelFile {
        path: PathBuf,
        format: &'static str,
        reason: String,
    },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error("chat template error: {0}")]
    ChatTemplate(String),
    #[error("invalid sampling parameters: {0}")]
    BadSampling(String),
    #[error("context overflow: {needed} tokens needed but the context holds {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    /// A paged KV cache's pool had no page left (the server's admission prevents it).
    #[error("KV page pool exhausted: {needed} more pages needed, {free} free")]
    KvPoolFull { needed: usize, free: usize },
    /// Bad input (a request, an option, a setting): the message says what and why; the server
    /// answers it with HTTP 400, the CLI prints it as it is.
    #[error("{0}")]
    BadRequest(String),
    #[error("fetching the model failed: {0}")]
    Fetch(String),
    /// What was being done when `err` happened (e.g. which drafter was loading).
    #[error("{context}: {err}")]
    Context { context: String, err: Box<Error> },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// `self`, said to have happened while doing `context`.
    pub fn context(self, context: impl Into<String>) -> Self {
        Error::Context {
            context: context.into(),
            err: Box::new(self),
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            err: source,
        }
    }
}
