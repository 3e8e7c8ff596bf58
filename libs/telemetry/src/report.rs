//! An error and its causes as one line, each cause once.
//!
//! Error types often repeat their source in their own message (`"{url}: {source}"`), and
//! layered clients wrap one cause in several errors with the same text (a transport error
//! around a connect error around the I/O error). Joining every level's message would then
//! say the same thing twice; [`error_chain`] leaves out a cause whose message the line
//! already holds.

use std::error::Error;

/// `error` and each of its sources joined with `": "`, leaving out a source whose message
/// is already part of the line.
pub fn error_chain(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !message.is_empty() && !line.contains(&message) {
            line.push_str(": ");
            line.push_str(&message);
        }
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("{message}")]
    struct Layer {
        message: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn chain(messages: &[&'static str]) -> Layer {
        messages
            .iter()
            .rev()
            .fold(None, |source, message| {
                Some(Layer {
                    message,
                    source: source.map(Box::new),
                })
            })
            .expect("at least one message")
    }

    #[test]
    fn each_cause_appears_once() {
        let wrapped = chain(&[
            "transport error",
            "tcp connect error",
            "tcp connect error",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(
            error_chain(&wrapped),
            "transport error: tcp connect error: Connection refused (os error 111)"
        );
        // A level that already says its source's message.
        let repeated = chain(&["s3://b/part-0.parquet: not found", "not found"]);
        assert_eq!(error_chain(&repeated), "s3://b/part-0.parquet: not found");
        assert_eq!(error_chain(&chain(&["alone"])), "alone");
    }
}
