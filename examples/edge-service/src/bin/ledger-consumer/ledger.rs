//! The ledger: what applying a `charges.created` event writes, and the totals it keeps.
//!
//! Two tables, written in the inbox's transaction (so with the record that says the event
//! was applied): one entry per charge, and a running total per currency. Applying an event
//! twice would count its amount twice in the totals: that is what the inbox prevents, and
//! what the tests check.

use std::collections::BTreeMap;

use idemstore::redb::{ReadableTable, TableDefinition};
use idemstore::{BoxError, Response, Store, Tx};
use serde::{Deserialize, Serialize};

/// Charge id → the event id that applied it and the amount.
pub(crate) const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("ledger_entries");
/// Currency → its [`Total`].
pub(crate) const TOTALS: TableDefinition<&str, &[u8]> = TableDefinition::new("ledger_totals");

/// The part of the edge service's charge JSON the ledger reads (other fields are ignored).
#[derive(Debug, Deserialize)]
pub(crate) struct Charge {
    id: String,
    amount: u64,
    currency: String,
}

/// One currency's charges applied so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Total {
    /// How many charges.
    pub(crate) count: u64,
    /// Their sum, in minor units.
    pub(crate) amount: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    event: String,
    amount: u64,
    currency: String,
}

/// What an event is, once read.
#[derive(Debug)]
pub(crate) enum Event {
    /// A charge to apply.
    Charge(Charge),
    /// Not a charge: recorded as refused (422), so every redelivery replays the refusal and
    /// is acked instead of looping.
    Unreadable(String),
}

impl Event {
    pub(crate) fn parse(payload: &[u8]) -> Event {
        match serde_json::from_slice::<Charge>(payload) {
            Ok(charge)
                if !charge.id.is_empty()
                    && charge.id.len() <= 128
                    && charge.currency.len() == 3 =>
            {
                Event::Charge(charge)
            }
            Ok(_) => Event::Unreadable(
                "a charge needs an id (at most 128 bytes) and a 3-letter currency".to_owned(),
            ),
            Err(e) => Event::Unreadable(format!("not a charge: {e}")),
        }
    }
}

/// Applies `event` (received as `event_id`): the inbox runs this once per event id, in the
/// transaction that records the event as applied.
pub(crate) fn apply(tx: &mut Tx<'_>, event_id: &str, event: Event) -> Result<Response, BoxError> {
    let charge = match event {
        Event::Charge(charge) => charge,
        Event::Unreadable(why) => return Ok(Response::new(422, why.into_bytes())),
    };
    // The same charge under another event id (a producer that published it twice): the
    // inbox cannot see it, the ledger can. Counted once.
    if tx.get(&ENTRIES, charge.id.as_str())?.is_some() {
        return Ok(Response::new(200, b"already in the ledger".to_vec()));
    }
    let mut total: Total = match tx.get(&TOTALS, charge.currency.as_str())? {
        Some(stored) => serde_json::from_slice(stored.value())?,
        None => Total::default(),
    };
    total.count += 1;
    total.amount = total
        .amount
        .checked_add(charge.amount)
        .ok_or("the currency's total overflowed u64")?;
    tx.insert(
        &TOTALS,
        charge.currency.as_str(),
        serde_json::to_vec(&total)?.as_slice(),
    )?;
    let entry = Entry {
        event: event_id.to_owned(),
        amount: charge.amount,
        currency: charge.currency,
    };
    tx.insert(
        &ENTRIES,
        charge.id.as_str(),
        serde_json::to_vec(&entry)?.as_slice(),
    )?;
    Ok(Response::new(200, Vec::new()))
}

/// The totals per currency, and the number of entries (charges applied).
pub(crate) fn totals(store: &Store) -> Result<(BTreeMap<String, Total>, u64), BoxError> {
    let read = store.read()?;
    let mut totals = BTreeMap::new();
    for item in read.open_table(TOTALS)?.iter()? {
        let (currency, total) = item?;
        totals.insert(
            currency.value().to_owned(),
            serde_json::from_slice::<Total>(total.value())?,
        );
    }
    let entries = idemstore::redb::ReadableTableMetadata::len(&read.open_table(ENTRIES)?)?;
    Ok((totals, entries))
}
