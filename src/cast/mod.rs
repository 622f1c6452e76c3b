//! TEMPORARY stub of the cast stage; replaced by the cast branch.
use crate::format::Dtype;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverflowPolicy {
    #[default]
    Error,
    Saturate,
    Inf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct CastStats {
    pub overflow: u64,
    pub underflow: u64,
    pub nan: u64,
}

impl std::ops::AddAssign for CastStats {
    fn add_assign(&mut self, o: Self) {
        self.overflow += o.overflow;
        self.underflow += o.underflow;
        self.nan += o.nan;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CastError {
    #[error("casting to {to} is not supported")]
    UnsupportedTarget { to: Dtype },
    #[error("tensor {tensor:?}: {count} values overflow {to} when cast from {from}; use --on-overflow saturate or inf")]
    Overflow { tensor: String, from: Dtype, to: Dtype, count: u64 },
    #[error("config.json is not a JSON object")]
    BadConfig,
}

pub fn target_for(from: Dtype, to: Dtype) -> Result<Option<Dtype>, CastError> {
    if !matches!(to, Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16) {
        return Err(CastError::UnsupportedTarget { to });
    }
    Ok((matches!(from, Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16) && from != to).then_some(to))
}

pub fn cast_parallel(_from: Dtype, _to: Dtype, _input: &[u8], _output: &mut [u8], _policy: OverflowPolicy) -> CastStats {
    unimplemented!("cast branch")
}

pub fn rewrite_config_dtype(config_json: &str, _to: Dtype) -> Result<String, CastError> {
    Ok(config_json.to_string())
}
