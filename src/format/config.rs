//! Bounded reading of a model folder's small JSON configs (`config.json`,
//! `hf_quant_config.json`): a size cap on the file, a cap on the number of
//! values counted before anything is parsed, and an object at the top.
//! What the keys mean is the business of the stage that asks (the cast's
//! dtype keys, quantization's scheme keys).

use serde_json::Value;

pub use super::error::ConfigError;

/// Largest `config.json` reshard reads or rewrites: 4 MiB. Real configs
/// are a few KiB; the largest carry label maps of ~20,000 classes (about
/// 1.3 MB).
pub const MAX_CONFIG: u64 = 4 << 20;

/// Most JSON values a `config.json` may hold before it is parsed. It is
/// parsed whole into `serde_json::Value`s (32 bytes each, plus vector
/// growth), so this bounds the parse to about 16 MiB whatever the bytes
/// are. A 20,000-class label map in both directions is ~80,000 values.
pub const MAX_CONFIG_VALUES: usize = 262_144;

/// Parses a config file's text (bounded: [`MAX_CONFIG_VALUES`])
/// into a JSON object.
pub fn parse_config(config_json: &str) -> Result<Value, ConfigError> {
    if value_bound(config_json) > MAX_CONFIG_VALUES {
        return Err(ConfigError::TooLarge {
            max: MAX_CONFIG_VALUES,
        });
    }
    let value: Value = serde_json::from_str(config_json).map_err(ConfigError::Json)?;
    if !value.is_object() {
        return Err(ConfigError::NotObject);
    }
    Ok(value)
}

/// An upper bound of the number of values in JSON `text`, found without
/// parsing: every value but the first follows a `,` `:` `[` or `{` outside
/// a string.
fn value_bound(text: &str) -> usize {
    let mut count = 1usize;
    let (mut in_string, mut escaped) = (false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b',' | b':' | b'[' | b'{' => count += 1,
                _ => {}
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_outside_strings_only() {
        assert_eq!(value_bound(r#"{"a": [1, 2], "b": "x,y:[{"}"#), 7);
    }
}
