//! The GGUF key/value list as gguf-py's `GGUFWriter` builds it: keys in
//! the order they are first added, a key added again keeps its place and
//! takes the new value, and empty strings and arrays are not written.

use crate::format::gguf::value::{Array, Strings, Value};

/// Ordered GGUF metadata under construction.
#[derive(Debug, Default)]
pub(super) struct Kvs(pub(super) Vec<(String, Value)>);

impl Kvs {
    pub(super) fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    pub(super) fn u32(&mut self, key: impl Into<String>, v: u32) {
        self.set(key, Value::U32(v));
    }

    pub(super) fn f32(&mut self, key: impl Into<String>, v: f32) {
        self.set(key, Value::F32(v));
    }

    pub(super) fn bool(&mut self, key: impl Into<String>, v: bool) {
        self.set(key, Value::Bool(v));
    }

    /// `add_string`: an empty string is not written.
    pub(super) fn string(&mut self, key: impl Into<String>, v: &str) {
        if !v.is_empty() {
            self.set(key, Value::String(v.as_bytes().to_vec()));
        }
    }

    /// `add_array` of strings: an empty array is not written.
    pub(super) fn strings(&mut self, key: impl Into<String>, v: Strings) {
        if !v.is_empty() {
            self.set(key, Value::Array(Array::String(v)));
        }
    }

    /// `add_array` of Python floats, which gguf-py types as FLOAT32.
    pub(super) fn f32s(&mut self, key: impl Into<String>, v: Vec<f32>) {
        if !v.is_empty() {
            self.set(key, Value::Array(Array::F32(v)));
        }
    }

    /// `add_array` of Python ints, which gguf-py types as INT32.
    pub(super) fn i32s(&mut self, key: impl Into<String>, v: Vec<i32>) {
        if !v.is_empty() {
            self.set(key, Value::Array(Array::I32(v)));
        }
    }
}
