//! Why a PyTorch file could not be read.

use std::io;

/// Why a PyTorch file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PytorchError {
    #[error("read failed")]
    Io {
        #[source]
        source: io::Error,
    },
    #[error("legacy torch format is not supported; re-save it with torch >= 1.6")]
    Legacy,
    #[error("not a torch.save zip archive (no zip end-of-central-directory record)")]
    NotZip,
    #[error("malformed zip archive: {reason}")]
    Zip { reason: String },
    #[error("zip archive has {count} entries, more than the limit of {max}")]
    TooManyEntries { count: u64, max: u64 },
    #[error("zip entry {name:?} is encrypted")]
    Encrypted { name: String },
    #[error("zip entry {name:?} uses compression method {method}; only stored and deflate are supported")]
    UnsupportedCompression { name: String, method: u16 },
    #[error("zip entry is called {central:?} in the central directory but {local:?} in its local header")]
    EntryNameMismatch { central: String, local: String },
    #[error(
        "zip entry {name:?} ends at byte {end} but the file has {file_len} bytes (truncated?)"
    )]
    EntryPastEnd {
        name: String,
        end: u64,
        file_len: u64,
    },
    #[error("zip entry {name:?} is {len} bytes, more than the limit of {max}")]
    EntryTooLarge { name: String, len: u64, max: u64 },
    #[error("zip entry {name:?} would inflate from {compressed} to {size} bytes, more than {max} times; refusing a deflate bomb")]
    InflateRatio {
        name: String,
        size: u64,
        compressed: u64,
        max: u64,
    },
    #[error(
        "zip entry {name:?} fails its CRC-32 check (stored {expected:08x}, computed {actual:08x})"
    )]
    CrcMismatch {
        name: String,
        expected: u32,
        actual: u32,
    },
    #[error("no data.pkl at the top of the archive; not a torch.save checkpoint")]
    NoDataPkl,
    #[error("the archive is TorchScript (torch.jit.save), not a state dict; save model.state_dict() with torch.save")]
    TorchScript,
    #[error("checkpoint was saved on a big-endian machine; only little-endian is supported")]
    BigEndian,
    #[error("{entry}: unknown byte order {found:?}")]
    UnknownByteOrder { entry: String, found: String },
    #[error("data.pkl at byte {pos}: {reason}")]
    Pickle { pos: u64, reason: String },
    #[error("refusing to load: the pickle calls {global}, which would run code; reshard only reads tensors")]
    ForbiddenGlobal { global: String },
    #[error("not a state dict: the pickle holds a {found}, not a dict of name to tensor")]
    NotStateDict { found: String },
    #[error("not a state dict: entry {name:?} is a {found}, not a tensor")]
    NotATensor { name: String, found: String },
    #[error("tensor {tensor:?} is set twice in the state dict")]
    DuplicateName { tensor: String },
    #[error("tensor {tensor:?}: {reason}")]
    BadTensor { tensor: String, reason: String },
    #[error("tensor {tensor:?}: its storage {key:?} has no entry {entry:?} in the archive")]
    MissingStorage {
        tensor: String,
        key: String,
        entry: String,
    },
    #[error("tensor {tensor:?}: storage entry {entry:?} holds {actual} bytes but the pickle declares {declared}")]
    StorageTooSmall {
        tensor: String,
        entry: String,
        declared: u64,
        actual: u64,
    },
    #[error("tensor {tensor:?}: its data reaches byte {end} of storage {entry:?}, which has {storage_len}")]
    OutOfStorage {
        tensor: String,
        entry: String,
        end: String,
        storage_len: u64,
    },
}
