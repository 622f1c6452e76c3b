//! The `general.*` keys gguf-py's `Metadata` writes for a model without a
//! model card or override file: `general.name` (and
//! `general.organization`) from config.json's `_name_or_path` when it is a
//! Hub id, else from the folder's name, title-cased as `id_to_title`
//! does; `general.size_label` from the parameter count
//! (`size_label` over the tensors written). The finer heuristics of
//! `get_model_id_components` (basename, finetune, version and a size
//! label taken from the name) are not reproduced.

use super::kv::Kvs;
use super::tensors::LlmTensor;

/// `general.type`, `general.name`, `general.organization` and
/// `general.size_label`, after `general.architecture`.
pub(super) fn write(kv: &mut Kvs, name_or_path: Option<&str>, folder: &str, tensors: &[LlmTensor]) {
    kv.string("general.type", "model");
    // A local path (two or more slashes) is not a model id.
    let hub = name_or_path.filter(|n| n.matches('/').count() <= 1);
    let (org, full) = match hub {
        // A sentence is a name as it is.
        Some(n) if n.contains(' ') => (None, n),
        Some(n) => match n.split_once('/') {
            Some((org, full)) => ((!org.starts_with('.')).then_some(org), full),
            None => (None, n),
        },
        None => (None, folder),
    };
    kv.string("general.name", &id_to_title(full));
    if let Some(org) = org.filter(|o| !o.is_empty()) {
        kv.string("general.organization", &id_to_title(org));
    }
    if let Some(label) = size_label(tensors) {
        kv.string("general.size_label", &label);
    }
}

/// `Metadata.id_to_title`: dashes to spaces, and each all-lowercase word
/// that is not a version (`v1.2`) or number-led title-cased.
pub(super) fn id_to_title(s: &str) -> String {
    let words: Vec<String> = s
        .trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            if is_lower(w) && !is_version_or_number(w) {
                title(w)
            } else {
                w.to_string()
            }
        })
        .collect();
    words.join(" ")
}

/// Python's `str.islower`: some cased character, none uppercase.
fn is_lower(w: &str) -> bool {
    w.chars().any(|c| c.is_lowercase() || c.is_uppercase()) && !w.chars().any(char::is_uppercase)
}

/// `^(v\d+(?:\.\d+)*|\d.*)$`.
fn is_version_or_number(w: &str) -> bool {
    if w.starts_with(|c: char| c.is_ascii_digit()) {
        return true;
    }
    let Some(rest) = w.strip_prefix('v') else {
        return false;
    };
    !rest.is_empty()
        && rest
            .split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Python's `str.title`: a cased character after an uncased one is
/// uppercased, after a cased one lowercased (`qwen2moe` -> `Qwen2Moe`).
fn title(w: &str) -> String {
    let mut out = String::with_capacity(w.len());
    let mut prev_cased = false;
    for c in w.chars() {
        let cased = c.is_lowercase() || c.is_uppercase();
        if prev_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        prev_cased = cased;
    }
    out
}

/// `gguf.size_label(*get_total_parameter_count())`, `None` for no weights.
fn size_label(tensors: &[LlmTensor]) -> Option<String> {
    let (mut total, mut expert_params, mut expert_sum, mut n_expert) = (0u128, 0u128, 0u128, 0u128);
    for t in tensors {
        let size: u128 = t.shape.iter().map(|&d| u128::from(d)).product();
        total += size;
        if t.name.contains("_exps.") && t.shape.len() >= 3 {
            let at = if t.name.contains(".bias") { 2 } else { 3 };
            let count = u128::from(t.shape[t.shape.len() - at]);
            if let Some(per_expert) = size.checked_div(count) {
                expert_params += per_expert;
                expert_sum += count;
                n_expert += 1;
            }
        }
    }
    if total == 0 {
        return None;
    }
    let shared = total - expert_total(tensors);
    Some(if let Some(count) = expert_sum.checked_div(n_expert) {
        format!("{count}x{}", rounded(shared + expert_params))
    } else {
        rounded(total)
    })
}

/// The elements of the expert tensors.
fn expert_total(tensors: &[LlmTensor]) -> u128 {
    tensors
        .iter()
        .filter(|t| t.name.contains("_exps.") && t.shape.len() >= 3)
        .map(|t| t.shape.iter().map(|&d| u128::from(d)).product::<u128>())
        .sum()
}

/// `model_weight_count_rounded_notation(n, min_digits=2)`.
fn rounded(n: u128) -> String {
    let x = n as f64;
    let (scaled, suffix) = if x > 1e12 {
        (x * 1e-12, "T")
    } else if x > 1e9 {
        (x * 1e-9, "B")
    } else if x > 1e6 {
        (x * 1e-6, "M")
    } else {
        (x * 1e-3, "K")
    };
    // len(str(round(scaled)).lstrip('0')); Python rounds half to even.
    let whole = scaled.round_ties_even() as u128;
    let digits = whole.to_string().trim_start_matches('0').len();
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}
