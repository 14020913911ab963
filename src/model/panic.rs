//! What a panic said, for the error that reports it: the one reading of a panic payload,
//! used wherever the store catches a panic in user code or in itself.

/// The text of a panic payload, for error messages.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}
