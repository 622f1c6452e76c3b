//! A restricted pickle machine: it turns `data.pkl` into plain [`Value`]s and
//! never imports, calls or executes anything.
//!
//! Only the opcodes torch.save emits (protocols 2 to 5) are accepted; every
//! other opcode is an error. `GLOBAL` / `STACK_GLOBAL` resolve names against
//! the whitelist in [`super::globals`], which maps each allowed name to a
//! data constructor; any other name is refused before anything else happens.
//!
//! Memory is budgeted ([`super::budget`]): every value the machine holds
//! (on the stack, in the memo, in a list, dict or tuple) and every byte of
//! every string is charged to a [`Limits::bytes`] budget proportional to the
//! pickle's length before it is allocated, and the allocation itself is a
//! `try_reserve`, so a hostile pickle ends in an error (exit 2), never in an
//! abort. This module knows nothing of zip archives or of what a state dict
//! is ([`super::state`] does).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use super::budget::{Budget, Exhausted, CONTAINER, MEMO_ENTRY};
use super::globals;
use super::value::{Shared, Value};
use super::PytorchError;

/// Most values on the stack (and marks) at once. Pickle protocol 2 and up
/// batches APPENDS and SETITEMS by 1,000, so a torch pickle's stack holds a
/// few thousand values at most; 100,000 is far past any of them.
pub const MAX_STACK: usize = 100_000;
/// Most memo entries.
pub const MAX_MEMO: usize = 8_000_000;

/// The bounds one run of the machine works within.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub stack: usize,
    pub memo: usize,
    /// Bytes of values and strings the machine may hold (charged, never
    /// refunded).
    pub bytes: u64,
}

impl Limits {
    /// The limits for a pickle of `len` bytes (see [`Budget::for_len`]).
    pub fn for_len(len: usize) -> Limits {
        Limits {
            stack: MAX_STACK,
            memo: MAX_MEMO,
            bytes: Budget::for_len(len),
        }
    }
}

/// Runs the pickle in `data` and returns the object `STOP` leaves.
pub fn run(data: &[u8]) -> Result<Value, PytorchError> {
    run_with(data, Limits::for_len(data.len()))
}

/// [`run`] with other limits.
pub fn run_with(data: &[u8], limits: Limits) -> Result<Value, PytorchError> {
    run_counted(data, limits).0
}

/// [`run_with`], also returning the bytes charged (for fuzzing and tests:
/// never more than `limits.bytes`).
pub fn run_counted(data: &[u8], limits: Limits) -> (Result<Value, PytorchError>, u64) {
    let mut m = Machine {
        limits,
        data,
        pos: 0,
        op_pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        budget: Budget::new(limits.bytes),
    };
    let result = m.run();
    (result, m.budget.held)
}

struct Machine<'a> {
    limits: Limits,
    data: &'a [u8],
    pos: usize,
    /// Position of the opcode being executed, for messages.
    op_pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    budget: Budget,
}

/// Opcodes that torch.save never writes, named for the error message.
fn refused_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x82..=0x84 => "EXT",
        b'P' => "PERSID",
        b'I' => "INT",
        b'L' => "LONG",
        b'F' => "FLOAT",
        b'S' | b'T' | b'U' => "STRING",
        b'V' => "UNICODE",
        b'p' => "PUT",
        b'g' => "GET",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

impl<'a> Machine<'a> {
    fn err(&self, reason: impl Into<String>) -> PytorchError {
        PytorchError::Pickle {
            pos: self.op_pos as u64,
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PytorchError> {
        let data = self.data;
        let bytes = self
            .pos
            .checked_add(n)
            .and_then(|end| data.get(self.pos..end))
            .ok_or_else(|| {
                self.err(format!(
                    "needs {n} more bytes but the pickle ends (truncated?)"
                ))
            })?;
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], PytorchError> {
        let b = self.take(N)?;
        <[u8; N]>::try_from(b).map_err(|_| self.err("short read"))
    }

    fn u8(&mut self) -> Result<u8, PytorchError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, PytorchError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A length prefix, checked against the bytes left before anything is
    /// allocated.
    fn len_u64(&mut self, len: u64) -> Result<usize, PytorchError> {
        let left = self.data.len() - self.pos;
        match usize::try_from(len) {
            Ok(n) if n <= left => Ok(n),
            _ => Err(self.err(format!("declares {len} bytes but only {left} are left"))),
        }
    }

    /// The error for a failed charge.
    fn exhausted(&self, why: Exhausted) -> PytorchError {
        self.err(match why {
            Exhausted::Budget => format!(
                "would hold more than {} bytes of values, its budget for a {}-byte pickle \
                 (a real state dict needs a fraction of that)",
                self.budget.limit,
                self.data.len()
            ),
            Exhausted::Memory => format!(
                "out of memory after {} bytes of values; refusing to go on",
                self.budget.held
            ),
        })
    }

    /// Charges `bytes` to the budget before they are allocated.
    fn charge(&mut self, bytes: u64) -> Result<(), PytorchError> {
        self.budget.charge(bytes).map_err(|e| self.exhausted(e))
    }

    /// Makes room for `extra` more items in `v`, charged by capacity.
    fn grow<T>(&mut self, v: &mut Vec<T>, extra: usize) -> Result<(), PytorchError> {
        self.budget.grow(v, extra).map_err(|e| self.exhausted(e))
    }

    fn push(&mut self, v: Value) -> Result<(), PytorchError> {
        if self.stack.len() >= self.limits.stack {
            return Err(self.err(format!("stack grows past {} values", self.limits.stack)));
        }
        let mut stack = std::mem::take(&mut self.stack);
        let grown = self.grow(&mut stack, 1);
        self.stack = stack;
        grown?;
        self.stack.push(v);
        Ok(())
    }

    /// Pushes a new container (list, dict, tuple): its own allocation too.
    fn push_new(&mut self, v: Value) -> Result<(), PytorchError> {
        self.charge(CONTAINER)?;
        self.push(v)
    }

    fn pop(&mut self) -> Result<Value, PytorchError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("pops from an empty stack"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.err("pops from an empty stack"))
    }

    fn top(&self) -> Result<&Value, PytorchError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("reads an empty stack"));
        }
        self.stack
            .last()
            .ok_or_else(|| self.err("reads an empty stack"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, PytorchError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK to pop to"))?;
        if mark > self.stack.len() {
            return Err(self.err("MARK above the stack"));
        }
        self.split_stack(mark)
    }

    /// The values above `at`, moved into a new vector (which is charged).
    fn split_stack(&mut self, at: usize) -> Result<Vec<Value>, PytorchError> {
        let n = self.stack.len() - at;
        let mut items = self.budget.exact(n).map_err(|e| self.exhausted(e))?;
        items.extend(self.stack.drain(at..));
        Ok(items)
    }

    fn str_of(&mut self, n: usize) -> Result<Value, PytorchError> {
        let bytes = self.take(n)?;
        let s = std::str::from_utf8(bytes).map_err(|_| self.err("string is not valid UTF-8"))?;
        self.charge(n as u64 + 16)?;
        Ok(Value::Str(Rc::<str>::from(s)))
    }

    fn bytes_of(&mut self, n: usize) -> Result<Value, PytorchError> {
        let bytes = self.take(n)?;
        self.charge(n as u64 + 16)?;
        Ok(Value::Bytes(Rc::<[u8]>::from(bytes)))
    }

    fn line(&mut self) -> Result<String, PytorchError> {
        let rest = self.data.get(self.pos..).unwrap_or_default();
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.err("GLOBAL name has no newline (truncated?)"))?;
        let bytes = self.take(n)?;
        self.take(1)?; // the newline
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| self.err("GLOBAL name is not valid UTF-8"))
    }

    fn memo_put(&mut self, key: u32) -> Result<(), PytorchError> {
        let v = self.top()?.clone();
        if self.memo.len() >= self.limits.memo && !self.memo.contains_key(&key) {
            return Err(self.err(format!("memo grows past {} entries", self.limits.memo)));
        }
        if !self.memo.contains_key(&key) {
            self.charge(MEMO_ENTRY)?;
            if self.memo.try_reserve(1).is_err() {
                return Err(self.exhausted(Exhausted::Memory));
            }
        }
        self.memo.insert(key, v);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), PytorchError> {
        let v = self
            .memo
            .get(&key)
            .cloned()
            .ok_or_else(|| self.err(format!("memo index {key} was never stored")))?;
        self.push(v)
    }

    fn int(&mut self, bytes_len: usize) -> Result<Value, PytorchError> {
        let bytes = self.take(bytes_len)?;
        if bytes.len() > 8 {
            return Ok(Value::BigInt);
        }
        let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
        let mut buf = if negative { [0xff; 8] } else { [0; 8] };
        for (d, s) in buf.iter_mut().zip(bytes) {
            *d = *s;
        }
        Ok(Value::Int(i64::from_le_bytes(buf)))
    }

    fn tuple(&mut self, items: Vec<Value>) -> Result<(), PytorchError> {
        self.push_new(Value::Tuple(Rc::new(items)))
    }

    fn run(&mut self) -> Result<Value, PytorchError> {
        loop {
            self.op_pos = self.pos;
            let op = self
                .u8()
                .map_err(|_| self.err("ends without STOP (truncated?)"))?;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if !(2..=5).contains(&proto) {
                        return Err(self.err(format!(
                            "pickle protocol {proto} is not supported (torch writes 2 to 5)"
                        )));
                    }
                }
                0x95 => {
                    self.array::<8>()?; // FRAME: a length hint only
                }
                b'.' => return self.pop(),
                b'(' => {
                    if self.marks.len() >= self.limits.stack {
                        return Err(self.err(format!("more than {} open MARKs", self.limits.stack)));
                    }
                    let mut marks = std::mem::take(&mut self.marks);
                    let grown = self.grow(&mut marks, 1);
                    self.marks = marks;
                    grown?;
                    self.marks.push(self.stack.len());
                }
                b'0' => drop(self.pop()?),
                b'1' => drop(self.pop_mark()?),
                b'2' => {
                    let v = self.top()?.clone();
                    self.push(v)?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = i32::from_le_bytes(self.array()?);
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(i64::from(v)))?;
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.array()?);
                    self.push(Value::Int(i64::from(v)))?;
                }
                0x8a => {
                    let n = usize::from(self.u8()?);
                    let v = self.int(n)?;
                    self.push(v)?;
                }
                0x8b => {
                    let n = self.u32()?;
                    let n = self.len_u64(u64::from(n))?;
                    let v = self.int(n)?;
                    self.push(v)?;
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.array()?);
                    self.push(Value::Float(v))?;
                }
                b'X' | 0x8c | 0x8d | b'B' | b'C' | 0x8e => {
                    let len = match op {
                        0x8c | b'C' => u64::from(self.u8()?),
                        b'X' | b'B' => u64::from(self.u32()?),
                        _ => u64::from_le_bytes(self.array()?),
                    };
                    let n = self.len_u64(len)?;
                    let v = if matches!(op, b'X' | 0x8c | 0x8d) {
                        self.str_of(n)?
                    } else {
                        self.bytes_of(n)?
                    };
                    self.push(v)?;
                }
                b'}' => self.push_new(Value::Dict(Rc::default()))?,
                b']' => self.push_new(Value::List(Rc::default()))?,
                b')' => self.tuple(Vec::new())?,
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let floor = self.marks.last().copied().unwrap_or(0);
                    let at = self
                        .stack
                        .len()
                        .checked_sub(n)
                        .filter(|&at| at >= floor)
                        .ok_or_else(|| self.err("TUPLE pops from an empty stack"))?;
                    let items = self.split_stack(at)?;
                    self.tuple(items)?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.tuple(items)?;
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push_new(Value::List(Rc::new(RefCell::new(items))))?;
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(items)?;
                    self.push_new(Value::Dict(Rc::new(RefCell::new(pairs))))?;
                }
                b'q' => {
                    let k = self.u8()?;
                    self.memo_put(u32::from(k))?;
                }
                b'r' => {
                    let k = self.u32()?;
                    self.memo_put(k)?;
                }
                0x94 => {
                    let k =
                        u32::try_from(self.memo.len()).map_err(|_| self.err("memo too large"))?;
                    self.memo_put(k)?;
                }
                b'h' => {
                    let k = self.u8()?;
                    self.memo_get(u32::from(k))?;
                }
                b'j' => {
                    let k = self.u32()?;
                    self.memo_get(k)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let g = globals::resolve(&module, &name)?;
                    self.push(Value::Global(g))?;
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    let (Value::Str(module), Value::Str(name)) = (&module, &name) else {
                        return Err(self.err("STACK_GLOBAL needs two strings"));
                    };
                    let g = globals::resolve(module, name)?;
                    self.push(Value::Global(g))?;
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let (Value::Global(g), Value::Tuple(args)) = (&callable, &args) else {
                        return Err(self.err(format!(
                            "REDUCE of a {} with a {}",
                            callable.kind(),
                            args.kind()
                        )));
                    };
                    let v = globals::call(*g, args).map_err(|reason| self.err(reason))?;
                    self.charge(globals::cost(&v))?;
                    self.push(v)?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let storage = globals::storage(&pid).map_err(|reason| self.err(reason))?;
                    self.charge(CONTAINER + storage.key.len() as u64)?;
                    self.push(Value::Storage(Rc::new(storage)))?;
                }
                b'b' => {
                    let _state = self.pop()?;
                    match self.top()? {
                        // OrderedDict state (`_metadata`) and tensor state
                        // carry nothing reshard writes.
                        Value::Dict(_) | Value::Tensor(_) => {}
                        other => return Err(self.err(format!("BUILD on a {}", other.kind()))),
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let dict = self.dict_top()?;
                    let mut dict = dict.borrow_mut();
                    self.grow(&mut dict, 1)?;
                    dict.push((k, v));
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(items)?;
                    let dict = self.dict_top()?;
                    let mut dict = dict.borrow_mut();
                    self.grow(&mut dict, pairs.len())?;
                    dict.extend(pairs);
                }
                b'a' => {
                    let v = self.pop()?;
                    let list = self.list_top()?;
                    let mut list = list.borrow_mut();
                    self.grow(&mut list, 1)?;
                    list.push(v);
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    let list = self.list_top()?;
                    let mut list = list.borrow_mut();
                    self.grow(&mut list, items.len())?;
                    list.extend(items);
                }
                other => {
                    let name = refused_name(other).unwrap_or("unknown");
                    return Err(self.err(format!(
                        "opcode {name} (0x{other:02x}) is not one torch.save writes; refusing to go on"
                    )));
                }
            }
        }
    }

    fn pairs(&mut self, items: Vec<Value>) -> Result<Vec<(Value, Value)>, PytorchError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err("odd number of items for a dict"));
        }
        let mut pairs = self
            .budget
            .exact(items.len() / 2)
            .map_err(|e| self.exhausted(e))?;
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            pairs.push((k, v));
        }
        Ok(pairs)
    }

    fn dict_top(&self) -> Result<Shared<(Value, Value)>, PytorchError> {
        match self.top()? {
            Value::Dict(d) => Ok(Rc::clone(d)),
            other => Err(self.err(format!("SETITEM on a {}", other.kind()))),
        }
    }

    fn list_top(&self) -> Result<Shared<Value>, PytorchError> {
        match self.top()? {
            Value::List(l) => Ok(Rc::clone(l)),
            other => Err(self.err(format!("APPEND on a {}", other.kind()))),
        }
    }
}

#[cfg(test)]
#[path = "pickle_tests.rs"]
mod tests;
