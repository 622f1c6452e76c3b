//! What `convert` is asked to write one form of `fit --for`'s plan
//! ([`Conversion`]): the flags of the candidate's command, the plan options
//! it was sized with, and what `convert --fit` runs, one value for all
//! three.

use serde::{Deserialize, Serialize};

use super::judge::size_arg;
use super::program::Form;
use crate::format::{Dtype, Format};
use crate::plan::quantize::QuantizeScheme;
use crate::plan::{OutputFormat, PlanOptions};

/// What `convert` is asked to write one form: the flags of the
/// candidate's command, the options the candidate was sized with, and
/// what `convert --fit` runs (one value for all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversion {
    pub dtype: Option<Dtype>,
    pub quantize: Option<QuantizeScheme>,
    pub format: OutputFormat,
    /// `--max-shard-size` of a folder output; `None`: one file.
    pub max_shard_size: Option<u64>,
}

impl Conversion {
    /// `form` written in shards of at most `max_shard_size` (`None`: one
    /// file).
    pub fn of(form: Form, max_shard_size: Option<u64>) -> Conversion {
        Conversion {
            dtype: form.dtype(),
            quantize: form.quantize(),
            format: match form.format() {
                Format::Gguf => OutputFormat::Gguf,
                _ => OutputFormat::Safetensors,
            },
            max_shard_size,
        }
    }

    /// The plan options of the conversion (the rest as `convert`'s
    /// defaults).
    pub fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            max_shard_size: self.max_shard_size.unwrap_or(u64::MAX),
            dtype: self.dtype,
            quantize: self.quantize,
            format: self.format,
            ..PlanOptions::default()
        }
    }

    /// The `convert` flags that ask for it, each with its leading space.
    pub fn flags(&self) -> String {
        let mut c = String::new();
        if let Some(size) = self.max_shard_size {
            c.push_str(&format!(" --max-shard-size {}", size_arg(size)));
        }
        if let Some(d) = self.dtype {
            c.push_str(&format!(" --dtype {}", d.name().to_ascii_lowercase()));
        }
        if let Some(q) = self.quantize {
            c.push_str(&format!(" --quantize {}", q.name()));
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_plan_options_say_the_same_conversion() {
        let c = Conversion::of(Form::Q8_0, None);
        let p = c.plan_options();
        // One file: no shard limit, and no --max-shard-size flag.
        assert_eq!(p.max_shard_size, u64::MAX);
        assert_eq!((p.format, p.quantize), (OutputFormat::Gguf, c.quantize));
        assert_eq!(c.flags(), " --quantize q8_0");
        let c = Conversion::of(Form::Bf16, Some(1 << 30));
        assert_eq!(c.plan_options().max_shard_size, 1 << 30);
        assert_eq!(c.plan_options().dtype, Some(Dtype::BF16));
        assert_eq!(c.flags(), " --max-shard-size 1GiB --dtype bf16");
    }
}
