//! The values the pickle machine builds, and the few data types they carry
//! (a whitelisted [`Global`], a [`Storage`], a [`TensorSpec`]).
//!
//! This module sits below the machine ([`super::pickle`]), the whitelist
//! ([`super::globals`]) and the state-dict reader ([`super::state`]), which
//! all use these types; it holds data and its drop only, no behaviour.

use std::cell::RefCell;
use std::rc::Rc;

use crate::format::Dtype;

/// A whitelisted global.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildTensorV3,
    RebuildParameter,
    RebuildParameterWithState,
    /// A typed storage class (`torch.FloatStorage`): its element type.
    StorageType(Dtype),
    /// `torch.UntypedStorage`: bytes.
    UntypedStorage,
    /// A dtype object (`torch.bfloat16`).
    Dtype(Dtype),
    Size,
    Device,
    CodecsEncode,
    GetLayout,
    Strided,
}

/// A storage named by a persistent id: `('storage', type, key, location, numel)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    /// The zip entry is `<archive>/data/<key>`.
    pub key: String,
    pub dtype: Dtype,
    /// Elements of `dtype` (bytes for an untyped storage).
    pub numel: u64,
}

/// What `_rebuild_tensor_v2` was called with, shape-checked but not yet
/// bounds-checked against the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub storage: Rc<Storage>,
    pub dtype: Dtype,
    /// In elements of `dtype`.
    pub offset: u64,
    pub shape: Vec<u64>,
    pub strides: Vec<u64>,
}

/// A mutable list or dict, shared the way pickle's memo shares objects.
pub type Shared<T> = Rc<RefCell<Vec<T>>>;

/// A value built by the machine. Containers are reference-counted so that
/// memo references (`BINGET`) cost O(1), whatever they point at.
#[derive(Debug, Clone)]
pub enum Value {
    None,
    // The payloads of Bool and Float are only shown (Debug) and compared
    // in tests: a state dict's structure never depends on them.
    Bool(#[allow(dead_code)] bool),
    Int(i64),
    /// An integer that does not fit in 64 bits (only its kind matters).
    BigInt,
    Float(#[allow(dead_code)] f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    Tuple(Rc<Vec<Value>>),
    List(Shared<Value>),
    /// Pairs in insertion order; later duplicates win when read.
    Dict(Shared<(Value, Value)>),
    /// A whitelisted name, not yet called.
    Global(Global),
    /// A storage named by a persistent id.
    Storage(Rc<Storage>),
    /// A tensor, or why its arguments were bad (reported with its name once
    /// the state dict says which name it has).
    Tensor(Rc<Result<TensorSpec, String>>),
}

impl Value {
    /// What kind of value this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Global(_) => "global",
            Value::Storage(_) => "storage",
            Value::Tensor(_) => "tensor",
        }
    }
}

/// Moves the children of a container that nothing else references into
/// `work`, so that dropping them cannot recurse.
fn take_children(v: &mut Value, work: &mut Vec<Value>) {
    match v {
        Value::Tuple(items) => {
            if let Some(items) = Rc::get_mut(items) {
                work.append(items);
            }
        }
        Value::List(items) if Rc::strong_count(items) == 1 => {
            if let Ok(mut items) = items.try_borrow_mut() {
                work.append(&mut items);
            }
        }
        Value::Dict(pairs) if Rc::strong_count(pairs) == 1 => {
            if let Ok(mut pairs) = pairs.try_borrow_mut() {
                for (k, v) in pairs.drain(..) {
                    work.push(k);
                    work.push(v);
                }
            }
        }
        _ => {}
    }
}

impl Drop for Value {
    /// Drops nested containers with a worklist: a pickle of `TUPLE1` repeated
    /// a million times nests a million deep, and recursive drop would
    /// overflow the stack.
    fn drop(&mut self) {
        let mut work = Vec::new();
        take_children(self, &mut work);
        while let Some(mut v) = work.pop() {
            take_children(&mut v, &mut work);
        }
    }
}
