//! Differential: the streaming redacting serialiser (`Redactor::to_json_string`,
//! used for fleet-wide `status`) must redact exactly as the `Value` walk
//! (`Redactor::json`) does, for any JSON document, and write valid JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let r = pdwarden_security::redact::Redactor::default();
    let mut expected = doc.clone();
    r.json(&mut expected);
    let streamed = r.to_json_string(&doc).expect("serialises");
    let parsed: serde_json::Value = serde_json::from_str(&streamed).expect("valid JSON");
    // Both through text: serde_json's float parsing does not round-trip
    // every f64 exactly (e.g. 101100104444444414444), on either path.
    let expected: serde_json::Value = serde_json::from_str(&serde_json::to_string(&expected).unwrap()).unwrap();
    assert_eq!(parsed, expected, "{streamed}");
});
