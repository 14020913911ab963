//! The body of the `record_decode` fuzz target: arbitrary bytes read as a stored record.

use crate::model::record::Record;
use crate::testing::Violation;

/// Decodes `bytes` as a record (either version). A record that decodes must encode (in the
/// current version) to bytes that decode to the same record, and no input may panic. Returns
/// whether the bytes were a record.
///
/// # Errors
/// A [`Violation`] describing the broken property (the fuzz target panics with it).
pub fn check_record_decode(bytes: &[u8]) -> Result<bool, Violation> {
    let Ok(record) = Record::decode(bytes) else {
        return Ok(false);
    };
    let again = Record::encode(&record);
    match Record::decode(&again) {
        Ok(back) if back == record => Ok(true),
        Ok(back) => Err(Violation(format!(
            "{record:?} re-encoded decodes as {back:?}"
        ))),
        Err(e) => Err(Violation(format!(
            "{record:?} re-encoded does not decode: {e}"
        ))),
    }
}

/// Valid stored records, in both versions and every state, for damaging (the fuzz target
/// and its test start from these, since random bytes rarely get past a record's head).
pub fn sample_records() -> Vec<Vec<u8>> {
    Record::samples()
        .iter()
        .flat_map(|r| [r.encode(), r.encode_v1()])
        .collect()
}
