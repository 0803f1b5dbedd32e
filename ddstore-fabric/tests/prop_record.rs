//! The libfabric share record parser (`ShareRecord::decode`) on arbitrary
//! bytes and on mutated, truncated and re-typed valid records: never a
//! panic; anything but a well-formed current-format record is an error that
//! names the rank.

use ddstore_fabric::ofi::ShareRecord;
use proptest::prelude::*;

fn record_strategy() -> impl Strategy<Value = ShareRecord> {
    (
        prop_oneof![
            Just("tcp;ofi_rxm".to_string()),
            Just("shm".to_string()),
            any::<String>()
        ],
        prop::collection::vec(any::<u8>(), 0..64),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(provider, addr, base, key, len)| {
            ShareRecord::new(provider, addr, base, key, len)
        })
}

/// Either an error naming the rank, or a record that encodes back to an equal one.
fn check_decode(rank: usize, bytes: &[u8]) -> Result<Option<ShareRecord>, TestCaseError> {
    let got = std::panic::catch_unwind(|| ShareRecord::decode(rank, bytes))
        .map_err(|_| TestCaseError::fail(format!("decode panicked on {bytes:?}")))?;
    match got {
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.contains(&format!("rank {rank}")), "{}", msg);
            Ok(None)
        }
        Ok(rec) => {
            prop_assert!(
                bytes.starts_with(b"DDFI"),
                "accepted without the magic: {:?}",
                bytes
            );
            prop_assert_eq!(
                ShareRecord::decode(rank, &rec.encode()).unwrap(),
                rec.clone()
            );
            Ok(Some(rec))
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    /// Replace a JSON field's value with another JSON value.
    Field(&'static str, &'static str),
    DropField(&'static str),
}

fn mutation_strategy() -> impl Strategy<Value = Mutation> {
    let fields = prop::sample::select(vec!["format", "provider", "addr", "base", "key", "len"]);
    let values = prop::sample::select(vec![
        "null",
        "true",
        "-1",
        "1.5",
        "\"x\"",
        "[]",
        "{}",
        "[256]",
        "[-1]",
        "18446744073709551616",
        "2",
        "0",
        "[1,2,3]",
    ]);
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        (fields.clone(), values).prop_map(|(f, v)| Mutation::Field(f, v)),
        fields.prop_map(Mutation::DropField),
    ]
}

/// Re-encodes a record after changing its JSON object.
fn edit_json(
    bytes: &[u8],
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> Vec<u8> {
    let mut json: serde_json::Value = serde_json::from_slice(&bytes[4..]).unwrap();
    edit(json.as_object_mut().unwrap());
    let mut out = bytes[..4].to_vec();
    out.extend(serde_json::to_vec(&json).unwrap());
    out
}

fn apply(rec: &ShareRecord, m: &Mutation) -> Vec<u8> {
    let mut bytes = rec.encode();
    match *m {
        Mutation::Truncate(i) => bytes.truncate(i % bytes.len()),
        Mutation::Flip(i, x) => {
            let i = i % bytes.len();
            bytes[i] ^= x;
        }
        Mutation::Insert(i, b) => bytes.insert(i % (bytes.len() + 1), b),
        Mutation::Remove(i) => {
            bytes.remove(i % bytes.len());
        }
        Mutation::Field(field, value) => {
            bytes = edit_json(&bytes, |obj| {
                obj.insert(field.to_string(), serde_json::from_str(value).unwrap());
            })
        }
        Mutation::DropField(field) => {
            bytes = edit_json(&bytes, |obj| {
                obj.remove(field);
            })
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(rank in 0usize..10_000, bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        check_decode(rank, &bytes)?;
        let mut with_magic = b"DDFI".to_vec();
        with_magic.extend(&bytes);
        check_decode(rank, &with_magic)?;
    }

    #[test]
    fn valid_records_round_trip(rec in record_strategy(), rank in 0usize..100) {
        prop_assert_eq!(check_decode(rank, &rec.encode())?, Some(rec));
    }

    #[test]
    fn mutated_records_are_rejected_unless_still_valid(
        rec in record_strategy(),
        m in mutation_strategy(),
        rank in 0usize..100,
    ) {
        let bytes = apply(&rec, &m);
        let got = check_decode(rank, &bytes)?;
        match &m {
            // A shorter record is never complete JSON; a dropped field is required.
            Mutation::Truncate(_) | Mutation::DropField(_) => prop_assert!(got.is_none(), "{:?} accepted", m),
            Mutation::Field("format", v) => prop_assert!(got.is_none(), "format {} accepted", v),
            _ => {}
        }
        if let Some(got) = got {
            prop_assert_eq!(got.format, 1);
        }
    }
}
