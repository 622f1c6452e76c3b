//! The machine flags (`--os`, `--ram`, `--pagefile`, `--commit-limit`,
//! `--vram`, `--loader`, ...): parsed by clap and resolved into fit's
//! [`Machine`] and [`FitOptions`]. Shared by `fit`, `batch` (`--mode fit`,
//! `--fit`) and `convert --fit`.

use reshard::fit::loader::{Loader, Os};
use reshard::fit::machine::{self, Given, Machine};
use reshard::fit::{self, FitOptions};
use reshard::plan::PlanOptions;
use reshard::units::ByteSize;

/// The machine and loaders to judge; shared by `fit` and `batch --mode fit`.
#[derive(Debug, Clone, clap::Args)]
#[command(group = clap::ArgGroup::new("commit").args(["pagefile", "commit_limit"]))]
pub struct MachineArgs {
    /// The OS of the machine to judge (default: the running one).
    #[arg(long, value_enum)]
    os: Option<OsArg>,
    /// Physical RAM (default: detected). On Linux this is taken as the RAM
    /// available to the load.
    #[arg(long, value_name = "SIZE")]
    ram: Option<ByteSize>,
    /// Pagefile (Windows) or swap (Linux) size (default: detected).
    #[arg(long, value_name = "SIZE")]
    pagefile: Option<ByteSize>,
    /// Commit limit (default: detected, or RAM + pagefile on Windows).
    #[arg(long, value_name = "SIZE")]
    commit_limit: Option<ByteSize>,
    /// Dedicated memory of GPU 0 (default: detected; without one the
    /// weights are assumed to stay in host memory).
    #[arg(long, value_name = "SIZE")]
    vram: Option<ByteSize>,
    /// A loader to judge (repeatable; default: all). The exit status
    /// depends on these only.
    #[arg(long = "loader", value_enum, value_name = "NAME")]
    loaders: Vec<LoaderArg>,
    /// Host memory a CUDA context commits on Windows (an estimate;
    /// default 512MiB).
    #[arg(long, value_name = "SIZE")]
    cuda_overhead: Option<ByteSize>,
    /// Reader threads of transformers' pread backend (default: min(4, cpus),
    /// as transformers 5.24 runs them).
    #[arg(long = "pread-threads", value_name = "N")]
    pread_threads: Option<u64>,
    /// Commit of the loader's Python process before it reads a weight
    /// (default: 976MiB, measured for torch + transformers on CPU); added to
    /// every Python loader's peak when judging, shown apart. A measured
    /// baseline is taken to hold the GPU runtime's commit (measure it after
    /// the device is initialised): --cuda-overhead is then not added again.
    #[arg(long, value_name = "SIZE")]
    baseline: Option<ByteSize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OsArg {
    Windows,
    Linux,
}

/// Loaders, named by what they do to memory. Each one's `--help` line is
/// the calibrated model's own row ([`Loader::real_loader`],
/// [`Loader::formula`]), as docs/fit.md shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoaderArg {
    TransformersV5Mmap,
    TransformersV5Pread,
    PerShardMmap,
    FullRead,
    Diffusers,
    LlamaCpp,
    ComfyuiGguf,
    Reshard,
}

impl clap::ValueEnum for LoaderArg {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            LoaderArg::TransformersV5Mmap,
            LoaderArg::TransformersV5Pread,
            LoaderArg::PerShardMmap,
            LoaderArg::FullRead,
            LoaderArg::Diffusers,
            LoaderArg::LlamaCpp,
            LoaderArg::ComfyuiGguf,
            LoaderArg::Reshard,
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let l = Loader::from(*self);
        let help = format!(
            "{}; peak commit above the baseline (CPU): {}",
            l.real_loader().replace('`', ""),
            l.formula()
        );
        Some(clap::builder::PossibleValue::new(l.name()).help(help))
    }
}

impl From<LoaderArg> for Loader {
    fn from(l: LoaderArg) -> Loader {
        match l {
            LoaderArg::TransformersV5Mmap => Loader::TransformersV5Mmap,
            LoaderArg::TransformersV5Pread => Loader::TransformersV5Pread,
            LoaderArg::PerShardMmap => Loader::PerShardMmap,
            LoaderArg::FullRead => Loader::FullRead,
            LoaderArg::Diffusers => Loader::Diffusers,
            LoaderArg::LlamaCpp => Loader::LlamaCpp,
            LoaderArg::ComfyuiGguf => Loader::ComfyuiGguf,
            LoaderArg::Reshard => Loader::Reshard,
        }
    }
}

/// `--cuda-overhead` when not given.
const DEFAULT_CUDA_OVERHEAD: u64 = 512 << 20;

impl MachineArgs {
    /// Whether any machine flag was given: `batch` takes them only where
    /// they are used (`--mode fit`, `--fit`).
    pub fn any_given(&self) -> bool {
        self.os.is_some()
            || self.ram.is_some()
            || self.pagefile.is_some()
            || self.commit_limit.is_some()
            || self.vram.is_some()
            || !self.loaders.is_empty()
            || self.cuda_overhead.is_some()
            || self.pread_threads.is_some()
            || self.baseline.is_some()
    }

    /// The machine: given figures over detected ones.
    pub fn machine(&self) -> Machine {
        let mut detected = machine::detect();
        if self.vram.is_none() {
            detected.vram = reshard::validate::device::cuda::dedicated_memory(0);
        }
        Machine::resolve(&self.given(), &detected, Os::current())
    }

    pub(crate) fn given(&self) -> Given {
        Given {
            os: self.os.map(|o| match o {
                OsArg::Windows => Os::Windows,
                OsArg::Linux => Os::Linux,
            }),
            ram: self.ram.map(ByteSize::bytes),
            pagefile: self.pagefile.map(ByteSize::bytes),
            commit_limit: self.commit_limit.map(ByteSize::bytes),
            vram: self.vram.map(ByteSize::bytes),
        }
    }

    /// Fit options judging `path`, optionally as converted with `what_if`.
    pub fn options(&self, path: String, what_if: Option<PlanOptions>) -> FitOptions {
        let defaults = FitOptions::default();
        FitOptions {
            loaders: self.loaders.iter().map(|&l| l.into()).collect(),
            threads: self.pread_threads.unwrap_or(defaults.threads),
            window: fit::DEFAULT_WINDOW,
            cuda_overhead: self
                .cuda_overhead
                .map_or(DEFAULT_CUDA_OVERHEAD, ByteSize::bytes),
            baseline: self.baseline.map_or(defaults.baseline, ByteSize::bytes),
            baseline_holds_device: self.baseline.is_some(),
            what_if,
            path,
        }
    }
}
