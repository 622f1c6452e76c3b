//! Unit tests of the pickle machine: hostile streams as byte literals.

use super::*;

fn err(data: &[u8]) -> String {
    match run(data) {
        Ok(v) => panic!("expected an error, got a {}", v.kind()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_torch_state_dict_prefix_runs() {
    // Protocol 2: {'a': 1} built the way torch.save writes dicts.
    let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.";
    let Value::Dict(ref d) = run(data).unwrap() else {
        panic!()
    };
    let d = d.borrow();
    assert_eq!(d.len(), 1);
    assert!(matches!(&d[0], (Value::Str(k), Value::Int(1)) if &**k == "a"));
}

#[test]
fn protocol_4_opcodes_run() {
    // FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL, BINGET, TUPLE3, LONG1.
    let mut data = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00".to_vec();
    data.extend_from_slice(b"\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94");
    data.extend_from_slice(b"\x8c\x01k\x94J\xff\xff\xff\xff\x8a\x02\x00\x01\x88\x87s.");
    let Value::Dict(ref d) = run(&data).unwrap() else {
        panic!()
    };
    let d = d.borrow();
    let (Value::Str(k), Value::Tuple(t)) = &d[0] else {
        panic!()
    };
    assert_eq!(&**k, "k");
    assert!(matches!(
        t.as_slice(),
        [Value::Int(-1), Value::Int(256), Value::Bool(true)]
    ));
}

#[test]
fn forbidden_globals_are_refused_by_name() {
    let e = err(b"\x80\x02cposix\nsystem\nq\x00X\x05\x00\x00\x00touch\x85R.");
    assert!(e.contains("posix.system") && e.contains("run code"), "{e}");
    let e = err(b"\x80\x02cbuiltins\neval\n.");
    assert!(e.contains("builtins.eval"), "{e}");
    // STACK_GLOBAL names are checked as well.
    let e = err(b"\x80\x04\x8c\x02os\x8c\x06system\x93.");
    assert!(e.contains("os.system"), "{e}");
}

#[test]
fn code_running_opcodes_are_refused() {
    for (data, name) in [
        (&b"\x80\x02(ccollections\nOrderedDict\no."[..], "OBJ"),
        (&b"\x80\x02(ix\ny\n."[..], "INST"),
        (&b"\x80\x02)\x81."[..], "NEWOBJ"),
        (&b"\x80\x02\x82\x01."[..], "EXT"),
        (&b"\x80\x02\xff."[..], "unknown"),
    ] {
        let e = err(data);
        assert!(e.contains(name), "{e}");
    }
}

#[test]
fn reduce_needs_a_whitelisted_callable() {
    let e = err(b"\x80\x02ctorch\nFloatStorage\n)R.");
    assert!(e.contains("arguments"), "{e}");
    let e = err(b"\x80\x02K\x01)R.");
    assert!(e.contains("REDUCE"), "{e}");
}

#[test]
fn truncation_anywhere_is_an_error() {
    let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.";
    for cut in 0..data.len() {
        assert!(run(&data[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn declared_lengths_are_checked_against_the_bytes_left() {
    let e = err(b"\x80\x02X\xff\xff\xff\x7fabc.");
    assert!(e.contains("only"), "{e}");
    let e = err(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffabc.");
    assert!(e.contains("only"), "{e}");
    let e = err(b"\x80\x02\x8b\xff\xff\xff\xff.");
    assert!(e.contains("only"), "{e}");
}

#[test]
fn memo_misses_and_stack_underflows_are_errors() {
    assert!(err(b"\x80\x02h\x05.").contains("memo index 5"));
    assert!(err(b"\x80\x02j\xff\xff\xff\xff.").contains("memo"));
    assert!(err(b"\x80\x02q\x00.").contains("empty stack"));
    assert!(err(b"\x80\x02R.").contains("empty stack"));
    assert!(err(b"\x80\x02\x87.").contains("empty stack"));
    assert!(err(b"\x80\x02t.").contains("MARK"));
    assert!(err(b"\x80\x02K\x01(\x85.").contains("empty stack"));
    assert!(err(b"\x80\x02NK\x01K\x02s.").contains("SETITEM on a None"));
    assert!(err(b"\x80\x02]K\x01K\x02u.").contains("MARK"));
    assert!(err(b"\x80\x02}(K\x01u.").contains("odd"));
    assert!(err(b"\x80\x09.").contains("protocol"));
}

/// Limits with a budget large enough for any test pickle.
fn roomy() -> Limits {
    Limits {
        stack: usize::MAX,
        memo: usize::MAX,
        bytes: 1 << 30,
    }
}

#[test]
fn deep_nesting_drops_without_overflowing_the_stack() {
    // 200,000 nested 1-tuples (far past what recursive drop survives), then
    // STOP. The default budget refuses this; a roomy one tests the drop.
    let mut data = b"\x80\x02N".to_vec();
    data.extend(std::iter::repeat_n(0x85u8, 200_000));
    data.push(b'.');
    assert!(run(&data).unwrap_err().to_string().contains("budget"));
    assert!(matches!(run_with(&data, roomy()).unwrap(), Value::Tuple(_)));
    // Lists nested through the memo: [[[...]]] 200,000 deep.
    let mut data = b"\x80\x02]q\x00".to_vec();
    for _ in 0..200_000 {
        data.extend_from_slice(b"]h\x00aq\x00");
    }
    data.extend_from_slice(b"0h\x00.");
    assert!(matches!(run_with(&data, roomy()).unwrap(), Value::List(_)));
}

#[test]
fn self_referencing_containers_do_not_hang() {
    // l = []; l.append(l)
    assert!(matches!(
        run(b"\x80\x02]q\x00h\x00a.").unwrap(),
        Value::List(_)
    ));
}

#[test]
fn budget_stack_and_memo_are_limited() {
    let small = Limits {
        stack: 100,
        memo: 100,
        bytes: 1 << 20,
    };
    let limited = |data: &[u8]| run_with(data, small).unwrap_err().to_string();
    // EMPTY_LIST / POP repeated is cheap per op but every list is charged.
    let mut data = b"\x80\x02".to_vec();
    data.extend(std::iter::repeat_n(*b"]0", 20_000).flatten());
    data.extend_from_slice(b"N.");
    assert!(limited(&data).contains("budget"));
    let mut data = b"\x80\x02".to_vec();
    data.extend(std::iter::repeat_n(b'N', 101));
    data.push(b'.');
    assert!(limited(&data).contains("stack"));
    let mut data = b"\x80\x02".to_vec();
    data.extend(std::iter::repeat_n(b'(', 101));
    assert!(limited(&data).contains("MARK"));
    let mut data = b"\x80\x02N".to_vec();
    for i in 0..101u32 {
        data.push(b'r');
        data.extend_from_slice(&i.to_le_bytes());
    }
    data.push(b'.');
    assert!(limited(&data).contains("memo"));
}

#[test]
fn a_list_of_millions_of_none_is_refused_within_its_budget() {
    // ] then 20 times ( N*50,000 e, then . : 1 MB of pickle that appends
    // 1,000,000 values to one list, in batches the stack limit allows.
    let mut data = b"\x80\x02]".to_vec();
    for _ in 0..20 {
        data.push(b'(');
        data.extend(std::iter::repeat_n(b'N', 50_000));
        data.push(b'e');
    }
    data.push(b'.');
    let limits = Limits::for_len(data.len());
    let (result, held) = run_counted(&data, limits);
    let err = result.unwrap_err().to_string();
    assert!(err.contains("budget"), "{err}");
    assert!(held <= limits.bytes, "charged {held} of {}", limits.bytes);
}
