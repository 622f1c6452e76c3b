//! The tokenizer files of a Hugging Face folder, read with a size cap:
//! the only file IO of this module. Everything else is a pure function of
//! their text.

use std::path::Path;

use crate::format::config::MAX_CONFIG;
use crate::format::read::{read_regular, read_regular_string};
use crate::format::FormatError;

/// Largest tokenizer.json or tokenizer.model read: 64 MiB. Real ones are a
/// few MiB (Llama 3's tokenizer.json 9 MB, Qwen2's 7 MB; Llama 2's
/// tokenizer.model 0.5 MB); Gemma 3's tokenizer.json, the largest, is 33 MB.
pub const MAX_TOKENIZER_JSON: u64 = 64 << 20;

/// The text of the files convert_hf_to_gguf.py reads for a BPE vocabulary,
/// `None` where a file is absent.
#[derive(Debug, Clone, Default)]
pub struct TokenizerFiles {
    pub tokenizer_json: Option<String>,
    pub tokenizer_config_json: Option<String>,
    /// `chat_template.jinja`, which gguf-py prefers to chat_template.json.
    pub chat_template_jinja: Option<String>,
    pub chat_template_json: Option<String>,
    /// `tokenizer.model`'s bytes (a SentencePiece vocabulary), which the
    /// converter prefers for Llama and Qwen2.
    pub sentencepiece_model: Option<Vec<u8>>,
    /// added_tokens.json, which the SentencePiece path reads.
    pub added_tokens_json: Option<String>,
    /// Whether `additional_chat_templates/` is there (named templates
    /// reshard refuses rather than writes half of).
    pub additional_chat_templates: bool,
}

impl TokenizerFiles {
    /// Reads the tokenizer files of `dir`, each a regular file of at most
    /// [`MAX_TOKENIZER_JSON`] (tokenizer.json) or
    /// [`MAX_CONFIG`] bytes (the others).
    pub fn read(dir: &Path) -> Result<TokenizerFiles, FormatError> {
        let optional = |name: &str, max: u64| match read_regular_string(&dir.join(name), max) {
            Ok(text) => Ok(Some(text)),
            Err(FormatError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        };
        Ok(TokenizerFiles {
            tokenizer_json: optional("tokenizer.json", MAX_TOKENIZER_JSON)?,
            tokenizer_config_json: optional("tokenizer_config.json", MAX_CONFIG)?,
            chat_template_jinja: optional("chat_template.jinja", MAX_CONFIG)?,
            chat_template_json: optional("chat_template.json", MAX_CONFIG)?,
            sentencepiece_model: match read_regular(
                &dir.join("tokenizer.model"),
                MAX_TOKENIZER_JSON,
            ) {
                Ok(bytes) => Some(bytes),
                Err(FormatError::NotFound { .. }) => None,
                Err(e) => return Err(e),
            },
            added_tokens_json: optional("added_tokens.json", MAX_CONFIG)?,
            additional_chat_templates: dir.join("additional_chat_templates").is_dir(),
        })
    }
}
