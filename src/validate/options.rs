//! What `validate` is asked to do, as plain serde data (the budget child
//! receives it as JSON): the device, the budgets, the source to compare
//! with, and the loader to emulate (one of fit's, [`Loader`]). Depends on
//! nothing else in `validate`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::exec::Reporter;

/// Default size of the one staging buffer every byte goes through.
pub const DEFAULT_STAGING: u64 = crate::fit::loader::DEFAULT_WINDOW;

/// Which device the load step puts tensors on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "ordinal")]
pub enum DeviceSpec {
    /// Host memory (`Vec<u8>`) standing in for device memory.
    #[default]
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceSpec::Cuda(n)),
                _ => Err(format!("invalid device {s:?}: use cpu, cuda or cuda:N")),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What to check and how. Serde so the budget child receives it as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidateOptions {
    pub device: DeviceSpec,
    /// Size of the staging buffer (capped at the largest tensor).
    pub staging: u64,
    /// Device bytes the load may hold in total, counted cumulatively as a
    /// GPU would hold them.
    pub vram_budget: Option<u64>,
    /// With `vram_budget`: the load offloads (a `device_map`, group
    /// offloading, `--n-gpu-layers`), and must hold at least this many
    /// leading blocks (layer order) in the budget; what follows them stays
    /// on the host instead of failing the load (`convert --fit --validate`
    /// of a plan that offloads).
    #[serde(default)]
    pub vram_leading_blocks: Option<usize>,
    /// Commit the load may add above its baseline. [`validate`] only
    /// measures and reports against it; [`validate_with_budget`] enforces it.
    pub commit_budget: Option<u64>,
    /// A source checkpoint every tensor is compared with.
    pub against: Option<PathBuf>,
    /// Reproduce another loader's mapping pattern instead of loading.
    pub emulate: Option<Loader>,
    /// Ctrl-C: every loop of the validation polls it and stops with
    /// [`super::ValidateError::Interrupted`]. Not sent to the budget child,
    /// which the parent kills instead.
    #[serde(skip)]
    pub cancel: Cancel,
    /// Where the bytes read are reported as they pass (the CLI's bar).
    /// Not serialized: the budget child relays its own progress to this
    /// one ([`super::relay`]).
    #[serde(skip)]
    pub progress: Progress,
}

/// The caller's [`Reporter`], or none. Like [`Cancel`], not part of what
/// is checked. The load reports, in order: [`Reporter::start`] with every
/// byte it will read (the tensors, twice with `--against`: the output's
/// and the source's comparison), [`Reporter::advance`] as they are read,
/// then [`Reporter::finish`].
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<dyn Reporter + Send>>);

impl Progress {
    pub fn new(reporter: Arc<dyn Reporter + Send>) -> Progress {
        Progress(Some(reporter))
    }

    /// Whether anything receives the reports.
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    pub fn start(&self, bytes: u64) {
        if let Some(r) = &self.0 {
            r.start(bytes);
        }
    }

    pub fn advance(&self, bytes: u64) {
        if let Some(r) = &self.0 {
            r.advance(bytes);
        }
    }

    pub fn shard_started(&self, file: &str) {
        if let Some(r) = &self.0 {
            r.shard_started(file);
        }
    }

    pub fn finish(&self) {
        if let Some(r) = &self.0 {
            r.finish();
        }
    }
}

impl PartialEq for Progress {
    fn eq(&self, _: &Progress) -> bool {
        true
    }
}

impl Eq for Progress {}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.0.is_some() { "reporter" } else { "none" };
        write!(f, "Progress({what})")
    }
}

/// The caller's cancel flag (Ctrl-C), or none. It is not part of what is
/// checked: two options that differ only in it are equal.
#[derive(Clone, Copy, Default)]
pub struct Cancel(Option<&'static AtomicBool>);

impl Cancel {
    pub fn new(flag: &'static AtomicBool) -> Cancel {
        Cancel(Some(flag))
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some_and(|f| f.load(Ordering::Relaxed))
    }
}

impl PartialEq for Cancel {
    fn eq(&self, _: &Cancel) -> bool {
        true
    }
}

impl Eq for Cancel {}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Cancel({})",
            if self.0.is_some() { "flag" } else { "none" }
        )
    }
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions {
            device: DeviceSpec::Cpu,
            staging: DEFAULT_STAGING,
            vram_budget: None,
            vram_leading_blocks: None,
            commit_budget: None,
            against: None,
            emulate: None,
            cancel: Cancel::default(),
            progress: Progress::default(),
        }
    }
}

/// A loader whose memory pattern `--emulate` reproduces: fit's own
/// loaders, so both use one model.
pub use crate::fit::loader::Loader;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("CUDA:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn options_round_trip_as_json() {
        let o = ValidateOptions {
            device: DeviceSpec::Cuda(1),
            commit_budget: Some(5),
            emulate: Some(Loader::PerShardMmap),
            against: Some(PathBuf::from("/src")),
            ..ValidateOptions::default()
        };
        let back: ValidateOptions =
            serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn parses_loader_names() {
        for l in Loader::ALL {
            assert_eq!(l.name().parse::<Loader>().unwrap(), l);
            assert_eq!(
                serde_json::to_string(&l).unwrap(),
                format!("\"{}\"", l.name())
            );
        }
        assert!("transformers".parse::<Loader>().is_err());
        assert_eq!("diffusers".parse::<Loader>().unwrap(), Loader::Diffusers);
    }
}
