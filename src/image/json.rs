//! Canonical JSON for everything whose digest we publish (configs,
//! manifests, indexes, the SBOM).
//!
//! NB: `serde_json::Map` is a `BTreeMap` (sorted keys) only while no crate
//! in the build enables serde_json's `preserve_order` feature; feature
//! unification could flip that and silently change every digest. So keys
//! are sorted here explicitly, and the output is compact (no whitespace),
//! as the OCI image spec's "canonical JSON" considerations suggest.

use serde_json::Value;

/// The canonical bytes of `v`: object keys sorted by byte order at every
/// level, compact, UTF-8.
pub fn canonical(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(1024);
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(k.clone()), out);
                out.push(b':');
                if let Some(v) = map.get(k) {
                    write(v, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(v: &Value, out: &mut Vec<u8>) {
    // Scalars have one serde_json rendering (strings escaped the same way
    // every time); writing into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, v).is_err() {
        out.extend_from_slice(b"null");
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    crate::core::package::digest(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_at_every_level_and_output_is_compact() {
        let v = serde_json::json!({"b": 1, "a": {"z": [1, {"y": 2, "x": "q\""}], "c": null}});
        assert_eq!(String::from_utf8(canonical(&v)).unwrap(), r#"{"a":{"c":null,"z":[1,{"x":"q\"","y":2}]},"b":1}"#);
    }
}
