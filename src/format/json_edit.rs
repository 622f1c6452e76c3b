//! Edits to a JSON object's text that keep every other byte as written.
//!
//! A config.json rewrite (the dtype keys of a cast, the
//! `quantization_config` a `--quantize` layout adds) must change only what
//! it means to: a round trip through `serde_json::Value` turns an integer
//! past u64 into a lossy float, `1e-05` into `1e-5`, and the author's
//! layout into serde's. This module finds where each member of an object
//! sits in the text ([`members`]) and splices values, removes members and
//! appends them by those positions. It works on text that has already been
//! parsed (so is valid JSON); on anything else it returns `None` and the
//! caller reports the parse error it already has.

use std::ops::Range;

/// Deepest nesting scanned, as serde_json's own recursion limit.
const MAX_DEPTH: usize = 128;

/// One `"key": value` member of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The key, unescaped.
    pub key: String,
    /// Byte offset of the key's opening quote.
    pub start: usize,
    /// Byte range of the value.
    pub value: Range<usize>,
    /// The members of the value, when it is an object.
    pub object: Option<Vec<Member>>,
}

/// The members of the object `text` holds (leading and trailing
/// whitespace allowed), with every nested object's members; `None` when
/// `text` is not exactly one JSON object.
pub fn members(text: &str) -> Option<Vec<Member>> {
    let mut s = Scanner {
        b: text.as_bytes(),
        text,
        at: 0,
    };
    s.ws();
    if s.peek()? != b'{' {
        return None;
    }
    let (_, members) = s.value(0)?;
    s.ws();
    (s.at == s.b.len()).then_some(members?)
}

/// `text` with each range replaced by its text; ranges must not overlap.
pub fn splice(text: &str, mut edits: Vec<(Range<usize>, String)>) -> String {
    edits.sort_by_key(|(r, _)| std::cmp::Reverse(r.start));
    let mut out = text.to_string();
    for (range, with) in edits {
        out.replace_range(range, &with);
    }
    out
}

/// The object `text` (whose members are `members`) without the members
/// `drop` picks; the others keep their bytes and the separators between
/// them are the text's first one.
pub fn without_members(text: &str, members: &[Member], drop: impl Fn(&Member) -> bool) -> String {
    let kept: Vec<&Member> = members.iter().filter(|m| !drop(m)).collect();
    let (Some(first), Some(last)) = (members.first(), members.last()) else {
        return text.to_string();
    };
    if kept.len() == members.len() {
        return text.to_string();
    }
    let head = &text[..first.start];
    let tail = &text[last.value.end..];
    if kept.is_empty() {
        return format!("{}{}", head.trim_end(), tail.trim_start());
    }
    let sep = separator(text, members);
    let body: Vec<&str> = kept.iter().map(|m| &text[m.start..m.value.end]).collect();
    format!("{head}{}{tail}", body.join(&sep))
}

/// The object `text` (whose members are `members`) with `"key": value`
/// appended after its last member, separated as its members are (a
/// 2-space-indented line where it has one member or none). `value` is JSON
/// text; its lines after the first are indented to the member's indent.
pub fn with_member(text: &str, members: &[Member], key: &str, value: &str) -> String {
    let key = serde_json::to_string(key).expect("a string serializes");
    let sep = separator(text, members);
    let indent = &sep[sep.rfind('\n').map_or(sep.len(), |i| i + 1)..];
    let value = value.replace('\n', &format!("\n{indent}"));
    match members.last() {
        Some(last) => {
            let at = last.value.end;
            format!("{}{sep}{key}: {value}{}", &text[..at], &text[at..])
        }
        None => {
            // `{}` or `{ }`: the member goes on its own line.
            let close = text.rfind('}').expect("an object ends with }");
            let open = text[..close].rfind('{').expect("an object starts with {");
            format!("{}\n  {key}: {value}\n{}", &text[..=open], &text[close..])
        }
    }
}

/// The text between an object's first two members (`,` and its
/// whitespace); for one member, a comma and the whitespace before it when
/// that breaks the line (`, ` when not); for none, a 2-space-indented line.
fn separator(text: &str, members: &[Member]) -> String {
    match members {
        [a, b, ..] => text[a.value.end..b.start].to_string(),
        [a] => {
            let open = text[..a.start].rfind('{').map_or(0, |i| i + 1);
            let before = &text[open..a.start];
            match before.contains('\n') {
                true => format!(",{before}"),
                false => ", ".into(),
            }
        }
        [] => ",\n  ".into(),
    }
}

struct Scanner<'t> {
    b: &'t [u8],
    text: &'t str,
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.at += 1)
    }

    /// One value from the current position (after whitespace): its range
    /// and, for an object, its members.
    fn value(&mut self, depth: usize) -> Option<(Range<usize>, Option<Vec<Member>>)> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        let start = self.at;
        let members = match self.peek()? {
            b'{' => Some(self.object(depth)?),
            b'[' => {
                self.array(depth)?;
                None
            }
            b'"' => {
                self.string()?;
                None
            }
            _ => {
                // A number or literal runs to the next delimiter.
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.at += 1;
                }
                if self.at == start {
                    return None;
                }
                None
            }
        };
        Some((start..self.at, members))
    }

    fn object(&mut self, depth: usize) -> Option<Vec<Member>> {
        self.eat(b'{')?;
        let mut out = Vec::new();
        self.ws();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(out);
        }
        loop {
            self.ws();
            let start = self.at;
            let key_range = self.string()?;
            let key: String = serde_json::from_str(&self.text[key_range]).ok()?;
            self.eat(b':')?;
            let (value, object) = self.value(depth + 1)?;
            out.push(Member {
                key,
                start,
                value,
                object,
            });
            self.ws();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        self.eat(b'[')?;
        self.ws();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            self.value(depth + 1)?;
            self.ws();
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string at the current position: its range, quotes included.
    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.at;
        if self.peek()? != b'"' {
            return None;
        }
        self.at += 1;
        loop {
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(start..self.at);
                }
                b'\\' => self.at += 2,
                _ => self.at += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_members_and_nested_objects_by_position() {
        let text = r#" {"a": 1, "b\"q": {"c": [1, {"x": 2}], "d": null}, "e": "s"} "#;
        let m = members(text).unwrap();
        let keys: Vec<&str> = m.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["a", "b\"q", "e"]);
        assert_eq!(&text[m[0].value.clone()], "1");
        assert_eq!(&text[m[2].value.clone()], "\"s\"");
        let inner = m[1].object.as_ref().unwrap();
        assert_eq!(&text[inner[0].value.clone()], r#"[1, {"x": 2}]"#);
        assert_eq!(&text[inner[1].value.clone()], "null");
        assert!(inner[0].object.is_none(), "arrays are not objects");
    }

    #[test]
    fn refuses_what_is_not_one_object() {
        for bad in ["[1]", "{", r#"{"a" 1}"#, r#"{"a": 1} x"#, "", r#"{"a": }"#] {
            assert_eq!(members(bad), None, "{bad}");
        }
        let deep = format!(
            "{}{}",
            "{\"a\":".repeat(200),
            "1".to_string() + &"}".repeat(200)
        );
        assert_eq!(members(&deep), None, "past the depth limit");
    }

    #[test]
    fn removing_and_appending_keep_every_other_byte() {
        let text = "{\n    \"q\": {\"x\": 1},\n    \"big\": 123456789012345678901234567890,\n    \"eps\": 1e-05,\n    \"r\": 2\n}\n";
        let m = members(text).unwrap();
        let out = without_members(text, &m, |m| m.key == "q" || m.key == "r");
        assert_eq!(
            out,
            "{\n    \"big\": 123456789012345678901234567890,\n    \"eps\": 1e-05\n}\n"
        );
        let m = members(&out).unwrap();
        let out = with_member(&out, &m, "dtype", "\"bfloat16\"");
        assert_eq!(
            out,
            "{\n    \"big\": 123456789012345678901234567890,\n    \"eps\": 1e-05,\n    \"dtype\": \"bfloat16\"\n}\n"
        );
        let all = without_members(&out, &members(&out).unwrap(), |_| true);
        assert_eq!(all, "{}\n");
        assert_eq!(
            with_member(&all, &members(&all).unwrap(), "k", "{\n  \"v\": 1\n}"),
            "{\n  \"k\": {\n    \"v\": 1\n  }\n}\n"
        );
    }

    #[test]
    fn splices_values_in_place() {
        let text = r#"{"a": "float32", "b": {"a": null}}"#;
        let m = members(text).unwrap();
        let inner = &m[1].object.as_ref().unwrap()[0];
        let out = splice(
            text,
            vec![
                (m[0].value.clone(), "\"bf16\"".into()),
                (inner.value.clone(), "\"x\"".into()),
            ],
        );
        assert_eq!(out, r#"{"a": "bf16", "b": {"a": "x"}}"#);
    }
}
