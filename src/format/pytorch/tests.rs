//! Unit tests of the whole PyTorch reader on archives built in memory, and
//! a mutation sweep over a real torch.save pickle.

use std::io::{Cursor, Write};

use super::*;

/// A protocol-2 pickle writer for the few shapes torch.save emits.
struct Pickle(Vec<u8>);

impl Pickle {
    fn new() -> Pickle {
        Pickle(vec![0x80, 2])
    }
    fn op(&mut self, b: &[u8]) -> &mut Pickle {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Pickle {
        self.op(b"X")
            .op(&(s.len() as u32).to_le_bytes())
            .op(s.as_bytes())
    }
    fn int(&mut self, n: i32) -> &mut Pickle {
        self.op(b"J").op(&n.to_le_bytes())
    }
    fn ints(&mut self, ns: &[i32]) -> &mut Pickle {
        self.op(b"(");
        for &n in ns {
            self.int(n);
        }
        self.op(b"t")
    }
    /// `name: _rebuild_tensor_v2(storage(key, numel), offset, shape, strides)`.
    #[allow(clippy::too_many_arguments)]
    fn tensor(
        &mut self,
        name: &str,
        storage: &str,
        key: &str,
        numel: i32,
        offset: i32,
        shape: &[i32],
        strides: &[i32],
    ) -> &mut Pickle {
        self.str(name).op(b"ctorch._utils\n_rebuild_tensor_v2\n((");
        self.str("storage")
            .op(format!("ctorch\n{storage}\n").as_bytes());
        self.str(key).str("cpu").int(numel).op(b"tQ").int(offset);
        self.ints(shape).ints(strides);
        self.op(b"\x89ccollections\nOrderedDict\n)RtR")
    }
}

/// A state dict pickle of `tensors` written by `f`.
fn state_dict(f: impl FnOnce(&mut Pickle)) -> Vec<u8> {
    let mut p = Pickle::new();
    p.op(b"}(");
    f(&mut p);
    p.op(b"u.");
    p.0
}

fn archive(pkl: &[u8], storages: &[(&str, &[u8])], method: ::zip::CompressionMethod) -> Vec<u8> {
    let mut w = ::zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = ::zip::write::SimpleFileOptions::default().compression_method(method);
    w.start_file("archive/data.pkl", opts).unwrap();
    w.write_all(pkl).unwrap();
    w.start_file("archive/byteorder", opts).unwrap();
    w.write_all(b"little").unwrap();
    for (key, bytes) in storages {
        w.start_file(format!("archive/data/{key}"), opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

fn stored(pkl: &[u8], storages: &[(&str, &[u8])]) -> Vec<u8> {
    archive(pkl, storages, ::zip::CompressionMethod::Stored)
}

/// The row-major bytes of a tensor as read.rs would produce them, gathered
/// from `bytes` by its DataRef.
fn gather(bytes: &[u8], t: &TensorMeta) -> Vec<u8> {
    let elem = (t.dtype.bits() / 8) as usize;
    match &t.data {
        DataRef::Contiguous { offset } => bytes[*offset as usize..][..t.len as usize].to_vec(),
        DataRef::Strided {
            storage,
            elem_offset,
            strides,
            ..
        } => {
            let mut out = Vec::new();
            let numel: u64 = t.shape.iter().product();
            for flat in 0..numel {
                let mut rem = flat;
                let mut e = *elem_offset;
                for (d, s) in t.shape.iter().zip(strides).rev() {
                    e += (rem % d) * s;
                    rem /= d;
                }
                let at = *storage as usize + e as usize * elem;
                out.extend_from_slice(&bytes[at..at + elem]);
            }
            out
        }
        DataRef::Deflated { .. } | DataRef::Blocks { .. } => panic!("not a torch layout"),
    }
}

#[test]
fn a_transposed_view_reads_in_row_major_order() {
    // Storage holds 0..6 as f32; the tensor is its [3, 2] transpose view.
    let storage: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let pkl = state_dict(|p| {
        p.tensor("t", "FloatStorage", "0", 6, 0, &[3, 2], &[1, 3]);
    });
    let bytes = stored(&pkl, &[("0", &storage)]);
    let (tensors, findings) = read_bytes(&bytes).unwrap();
    assert!(findings.is_empty());
    assert!(matches!(tensors[0].data, DataRef::Strided { .. }));
    let want: Vec<u8> = [0f32, 3., 1., 4., 2., 5.]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    assert_eq!(gather(&bytes, &tensors[0]), want);
}

#[test]
fn tied_tensors_are_both_returned_with_one_finding() {
    let storage = [0u8; 32];
    let pkl = state_dict(|p| {
        p.tensor("wte", "HalfStorage", "7", 16, 0, &[4, 4], &[4, 1]);
        p.tensor("head", "HalfStorage", "7", 16, 0, &[4, 4], &[4, 1]);
        p.tensor("bias", "HalfStorage", "8", 4, 0, &[4], &[1]);
    });
    let bytes = stored(&pkl, &[("7", &storage), ("8", &storage[..8])]);
    let (tensors, findings) = read_bytes(&bytes).unwrap();
    assert_eq!(tensors.len(), 3);
    assert_eq!(tensors[0].data, tensors[1].data);
    assert_eq!(tensors[0].dtype, Dtype::F16);
    assert_eq!(
        findings,
        vec![Finding::SharedStorage {
            tensors: vec!["wte".into(), "head".into()]
        }]
    );
}

#[test]
fn deflated_storages_become_deflated_refs() {
    let storage: Vec<u8> = (0..64u8).collect();
    let pkl = state_dict(|p| {
        p.tensor("b", "ByteStorage", "0", 64, 16, &[8], &[1]);
    });
    let bytes = archive(&pkl, &[("0", &storage)], ::zip::CompressionMethod::Deflated);
    let (tensors, _) = read_bytes(&bytes).unwrap();
    let DataRef::Deflated {
        entry,
        compressed_len,
        skip,
        ..
    } = tensors[0].data
    else {
        panic!()
    };
    assert_eq!(skip, 16);
    let raw = &bytes[entry as usize..][..compressed_len as usize];
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::DeflateDecoder::new(raw), &mut out).unwrap();
    assert_eq!(&out[16..24], &storage[16..24]);
}

#[test]
fn a_nested_state_dict_is_found() {
    let mut p = Pickle::new();
    p.op(b"}(").str("epoch").int(3).str("state_dict").op(b"}(");
    p.tensor("w", "FloatStorage", "0", 1, 0, &[1], &[1]);
    p.op(b"uu.");
    let bytes = stored(&p.0, &[("0", &[0; 4])]);
    let (tensors, _) = read_bytes(&bytes).unwrap();
    assert_eq!(tensors[0].name, "w");
}

#[test]
fn hostile_archives_fail_with_named_errors() {
    let ok_pkl = state_dict(|p| {
        p.tensor("w", "FloatStorage", "0", 4, 0, &[4], &[1]);
    });
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            stored(&ok_pkl, &[]),
            "\"w\": its storage \"0\" has no entry",
        ),
        (
            stored(&ok_pkl, &[("0", &[0; 8])]),
            "holds 8 bytes but the pickle declares 16",
        ),
        (
            stored(
                &state_dict(|p| {
                    p.tensor("w", "FloatStorage", "0", 4, 1, &[4], &[1]);
                }),
                &[("0", &[0; 16])],
            ),
            "tensor \"w\": its data reaches byte 20",
        ),
        (
            stored(
                &state_dict(|p| {
                    p.tensor(
                        "w",
                        "FloatStorage",
                        "0",
                        4,
                        0,
                        &[65536, 65536, 65536, 65536],
                        &[1, 1, 1, 1],
                    );
                }),
                &[("0", &[0; 16])],
            ),
            "tensor \"w\"",
        ),
        (
            stored(
                &state_dict(|p| {
                    p.tensor("w", "FloatStorage", "0", 4, 0, &[-1], &[1]);
                }),
                &[("0", &[0; 16])],
            ),
            "tensor \"w\": its size is not",
        ),
        (
            stored(
                &state_dict(|p| {
                    p.str("n").int(1);
                }),
                &[],
            ),
            "entry \"n\" is a int, not a tensor",
        ),
        (vec![0x80, 2, b'}', b'.'], "legacy torch format"),
        (
            b"hello world, not a zip at all".to_vec(),
            "not a torch.save zip",
        ),
    ];
    for (bytes, want) in cases {
        let e = read_bytes(&bytes).unwrap_err().to_string();
        assert!(e.contains(want), "{e:?} does not contain {want:?}");
    }
}

#[test]
fn big_endian_archives_are_refused() {
    let mut w = ::zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = ::zip::write::SimpleFileOptions::default()
        .compression_method(::zip::CompressionMethod::Stored);
    w.start_file("a/data.pkl", opts).unwrap();
    w.write_all(b"\x80\x02}.").unwrap();
    w.start_file("a/byteorder", opts).unwrap();
    w.write_all(b"big").unwrap();
    let bytes = w.finish().unwrap().into_inner();
    assert!(matches!(read_bytes(&bytes), Err(PytorchError::BigEndian)));
}

#[test]
fn torchscript_archives_are_named_as_such() {
    let mut w = ::zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = ::zip::write::SimpleFileOptions::default();
    for name in ["m/data.pkl", "m/constants.pkl"] {
        w.start_file(name, opts).unwrap();
        w.write_all(b"\x80\x02c__torch__\nModel\n.").unwrap();
    }
    let bytes = w.finish().unwrap().into_inner();
    assert!(matches!(read_bytes(&bytes), Err(PytorchError::TorchScript)));
}

#[test]
fn every_truncation_of_an_archive_is_an_error() {
    let pkl = state_dict(|p| {
        p.tensor("w", "FloatStorage", "0", 4, 0, &[4], &[1]);
    });
    let bytes = stored(&pkl, &[("0", &[1; 16])]);
    assert!(read_bytes(&bytes).is_ok());
    for cut in 0..bytes.len() {
        assert!(read_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn mutations_of_a_real_torch_pickle_never_panic() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-llama-bin/pytorch_model.bin"
    );
    let file = std::fs::read(path).unwrap();
    let index = ZipIndex::read(&file[..], file.len() as u64).unwrap();
    let pkl = ZipIndex::read_entry(
        &file[..],
        index.get("pytorch_model/data.pkl").unwrap(),
        MAX_PICKLE,
    )
    .unwrap();
    assert_eq!(parse_pickle(&pkl).unwrap().len(), 21);
    for i in 0..pkl.len() {
        for v in [0xff, pkl[i].wrapping_add(1)] {
            let mut m = pkl.clone();
            m[i] = v;
            let _ = parse_pickle(&m);
        }
    }
}

/// Every data.pkl of the torch-written fixtures.
fn fixture_pickles() -> Vec<(String, Vec<u8>)> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let mut out = Vec::new();
    for dir in ["tiny-llama-bin", "tiny-gpt2-bin", "tiny-moe-bin-sharded"] {
        for entry in std::fs::read_dir(format!("{root}/{dir}")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "bin") {
                let file = std::fs::read(&path).unwrap();
                let index = ZipIndex::read(&file[..], file.len() as u64).unwrap();
                let e = index
                    .entries()
                    .iter()
                    .find(|e| e.name.ends_with("/data.pkl"))
                    .unwrap();
                let pkl = ZipIndex::read_entry(&file[..], e, MAX_PICKLE).unwrap();
                out.push((path.display().to_string(), pkl));
            }
        }
    }
    out
}

#[test]
fn real_torch_pickles_charge_at_most_half_their_budget_per_byte() {
    use super::budget::HELD_PER_BYTE;
    use super::pickle::{run_counted, Limits};
    for (name, pkl) in fixture_pickles() {
        let (result, held) = run_counted(&pkl, Limits::for_len(pkl.len()));
        assert!(result.is_ok(), "{name}");
        let per_byte = held as f64 / pkl.len() as f64;
        eprintln!(
            "{name}: {} bytes, {held} charged, {per_byte:.2} a byte",
            pkl.len()
        );
        assert!(
            per_byte * 2.0 <= HELD_PER_BYTE as f64,
            "{name}: {per_byte:.2} bytes charged a byte"
        );
    }
}
