//! `Config::from_lookup` on arbitrary environment strings: never a panic;
//! a value is either accepted (and then sane) or rejected naming the variable.

use std::collections::HashMap;
use std::time::Duration;

use ddstore_core::Config;
use proptest::prelude::*;

const KEYS: [&str; 6] = [
    "DDSTORE_MAX_READ_BYTES",
    "DDSTORE_MAX_INFLIGHT",
    "DDSTORE_TIMEOUT_S",
    "DDSTORE_HANDSHAKE_TIMEOUT_S",
    "DDSTORE_SHM",
    "DDSTORE_THREAD_READERS",
];

/// Strings near the parsers' edges, plus arbitrary ones.
fn value_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "0.5",
            "1e3",
            "1e300",
            "-0",
            "inf",
            "-inf",
            "NaN",
            "infinity",
            " 2 ",
            "true",
            "off",
            "YES",
            "0x10",
            "1_000",
            "18446744073709551616",
            "4.9e-324",
            "1e-9",
        ])
        .prop_map(String::from),
        any::<f64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        "\\PC{0,12}",
        any::<String>(),
    ]
}

fn check(env: &HashMap<&'static str, String>) -> Result<(), TestCaseError> {
    let lookup = |k: &str| env.get(k).cloned();
    let got = std::panic::catch_unwind(|| Config::from_lookup(lookup));
    let cfg = match got {
        Err(_) => {
            return Err(TestCaseError::fail(format!(
                "Config::from_lookup panicked on {env:?}"
            )))
        }
        Ok(Err(e)) => {
            let msg = e.to_string();
            prop_assert!(
                KEYS.iter().any(|k| msg.contains(k) && env.contains_key(k)),
                "error names no variable that was set: {}",
                msg
            );
            return Ok(());
        }
        Ok(Ok(cfg)) => cfg,
    };
    prop_assert!(
        cfg.max_read_bytes >= 1 && cfg.max_inflight >= 1,
        "{:?}",
        cfg
    );
    prop_assert!(cfg.timeout > Duration::ZERO, "{:?}", cfg);
    prop_assert!(cfg.handshake_timeout > Duration::ZERO, "{:?}", cfg);
    // A deadline `now + timeout` must be computable.
    prop_assert!(
        std::time::Instant::now().checked_add(cfg.timeout).is_some(),
        "{:?}",
        cfg
    );
    prop_assert!(
        std::time::Instant::now()
            .checked_add(cfg.handshake_timeout)
            .is_some(),
        "{:?}",
        cfg
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn from_lookup_never_panics(values in prop::collection::vec(prop::option::of(value_strategy()), KEYS.len())) {
        let env: HashMap<&'static str, String> = KEYS
            .iter()
            .zip(values)
            .filter_map(|(k, v)| v.map(|v| (*k, v)))
            .collect();
        check(&env)?;
    }
}

/// Found by the property above: an infinite or huge timeout passes the
/// positivity check and `Duration::from_secs_f64` then panics.
#[test]
fn infinite_or_huge_timeouts_are_rejected_not_panics() {
    for key in ["DDSTORE_TIMEOUT_S", "DDSTORE_HANDSHAKE_TIMEOUT_S"] {
        for value in ["inf", "1e300", "infinity"] {
            let env: HashMap<&'static str, String> = [(key, value.to_string())].into();
            check(&env).unwrap_or_else(|e| panic!("{key}={value}: {e}"));
        }
    }
}
