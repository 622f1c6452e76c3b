//! gguf-py's `SpecialVocab` for a tokenizer.json vocabulary: the special
//! token ids, whether BOS, EOS and SEP are added, and the chat template,
//! read from tokenizer.json's post-processor, tokenizer_config.json, the
//! chat template files and config.json's `*_token_id`, with its
//! precedence (the first id found for a type wins; the post-processor's
//! add flags win over tokenizer_config.json's) and its order of keys.

use serde_json::{Map, Value as Json};

use super::error::ToGgufError;
use super::files::TokenizerFiles;
use super::kv::Kvs;
use super::vocab::AddedToken;

/// What `SpecialVocab.add_to_gguf` writes after the merges.
#[derive(Debug, Default)]
pub(super) struct Special {
    types: Vec<&'static str>,
    ids: Vec<(&'static str, u32)>,
    /// Ids at or past this are skipped (`SpecialVocab(n_vocab=...)`).
    n_vocab: Option<u32>,
    add: Vec<(&'static str, bool)>,
    chat: Option<Json>,
}

/// Python truthiness of a JSON value.
fn truthy(v: &Json) -> bool {
    match v {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64() != Some(0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

/// `x in (a, b)` for a token string against tokenizer_config values.
fn is_one_of(x: &str, values: &[&Json]) -> bool {
    values.iter().any(|v| v.as_str() == Some(x))
}

fn special_id(item: &Json) -> Option<&str> {
    item.get("SpecialToken")?
        .get("id")?
        .as_str()
        .filter(|s| !s.is_empty())
}

fn sequence_id(item: &Json) -> Option<&str> {
    item.get("Sequence")?.get("id")?.as_str()
}

impl Special {
    fn set_add(&mut self, typ: &'static str, v: bool) {
        match self.add.iter_mut().find(|(t, _)| *t == typ) {
            Some(slot) => slot.1 = v,
            None => self.add.push((typ, v)),
        }
    }

    fn add_default(&mut self, typ: &'static str, v: bool) {
        if !self.add.iter().any(|(t, _)| *t == typ) {
            self.add.push((typ, v));
        }
    }

    /// `_set_special_token`: integers only, the first one per type wins.
    fn set_id(
        &mut self,
        typ: &'static str,
        file: &'static str,
        v: Option<&Json>,
    ) -> Result<(), ToGgufError> {
        let Some(Json::Number(n)) = v else {
            return Ok(());
        };
        let Some(id) = n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)) else {
            return Ok(()); // a float is not an int to Python either
        };
        let id = u32::try_from(id).map_err(|_| ToGgufError::BadValue {
            file,
            key: format!("{typ}_token"),
            why: format!("id {id} is not a GGUF UINT32 token id"),
        })?;
        if self.n_vocab.is_some_and(|n| id >= n) {
            return Ok(()); // gguf-py warns and skips it
        }
        if !self.ids.iter().any(|(t, _)| *t == typ) {
            self.ids.push((typ, id));
        }
        Ok(())
    }
}

/// tokenizer.json's parts `SpecialVocab` reads: the added tokens and the
/// post-processor.
pub(super) type TokenizerParts<'a> = (&'a [AddedToken], &'a Json);

/// Reads the special tokens. `tokenizer_json` is `None` without a
/// tokenizer.json, `tokenizer_config` tokenizer_config.json's object
/// (`None` when absent), `config` config.json's lookup.
pub(super) fn load(
    tokenizer_json: Option<TokenizerParts>,
    tokenizer_config: Option<Map<String, Json>>,
    files: &TokenizerFiles,
    config: &dyn Fn(&str) -> Option<Json>,
    n_vocab: Option<u32>,
) -> Result<Special, ToGgufError> {
    let mut sp = Special {
        types: vec!["bos", "eos", "unk", "sep", "pad", "cls", "mask"],
        n_vocab,
        ..Special::default()
    };
    let (added, post_processor) = tokenizer_json.unwrap_or((&[], &Json::Null));
    let mut tc = tokenizer_config.unwrap_or_default();
    let has_tc = !tc.is_empty();
    let get = |tc: &Map<String, Json>, k: &str| tc.get(k).cloned().unwrap_or(Json::Null);
    let (mut bos, mut cls) = (get(&tc, "bos_token"), get(&tc, "cls_token"));
    let (mut eos, mut sep) = (get(&tc, "eos_token"), get(&tc, "sep_token"));
    let has_tj = tokenizer_json.is_some();
    if has_tj && !truthy(&bos) && truthy(&cls) && has_tc {
        bos = cls.clone();
        tc.insert("bos_token".into(), bos.clone());
    }
    if has_tj && !truthy(&eos) && truthy(&sep) && has_tc {
        eos = sep.clone();
        tc.insert("eos_token".into(), eos.clone());
    }
    if truthy(post_processor) {
        let processors = match post_processor.get("processors") {
            Some(Json::Array(a)) => a.clone(),
            _ => vec![post_processor.clone()],
        };
        for p in &processors {
            match p.get("type").and_then(Json::as_str) {
                Some("ByteLevel") => {
                    sp.add_default("bos", false);
                    sp.add_default("eos", false);
                }
                Some("RobertaProcessing") => {
                    for t in ["bos", "eos", "sep"] {
                        sp.set_add(t, true);
                    }
                    if !truthy(&cls) && has_tc {
                        cls = p
                            .get("cls")
                            .and_then(|c| c.get(0))
                            .cloned()
                            .unwrap_or(bos.clone());
                        tc.insert("cls_token".into(), cls.clone());
                    }
                    if !truthy(&sep) && has_tc {
                        sep = p
                            .get("sep")
                            .and_then(|c| c.get(0))
                            .cloned()
                            .unwrap_or(eos.clone());
                        tc.insert("sep_token".into(), sep.clone());
                    }
                }
                Some("TemplateProcessing") => {
                    let empty = Vec::new();
                    let single = p.get("single").and_then(Json::as_array).unwrap_or(&empty);
                    let pair = p.get("pair").and_then(Json::as_array).unwrap_or(&empty);
                    let (mut first, mut last) = (None, None);
                    if single.len() > 1 {
                        if let Some(f) = special_id(&single[0]) {
                            first = Some(f.to_string());
                            if !has_tc {
                                bos = Json::String(f.into());
                            } else if !is_one_of(f, &[&bos, &cls]) {
                                if !truthy(&bos) {
                                    bos = Json::String(f.into());
                                    tc.insert("bos_token".into(), bos.clone());
                                }
                                if !truthy(&cls) {
                                    cls = Json::String(f.into());
                                    tc.insert("cls_token".into(), cls.clone());
                                }
                            }
                            sp.set_add("bos", is_one_of(f, &[&bos, &cls]));
                        }
                        if let Some(l) = special_id(&single[single.len() - 1]) {
                            last = Some(l.to_string());
                            if !has_tc {
                                eos = Json::String(l.into());
                            } else if eos.as_str() != Some(l) {
                                for (typ, key) in [("eot", "eot_token"), ("eom", "eom_token")] {
                                    if !sp.types.contains(&typ) {
                                        sp.types.push(typ);
                                        tc.insert(key.into(), eos.clone());
                                        break;
                                    }
                                }
                                eos = Json::String(l.into());
                                tc.insert("eos_token".into(), eos.clone());
                            }
                            sp.set_add("eos", eos.as_str() == Some(l));
                        }
                    }
                    if !pair.is_empty() {
                        let start = usize::from(
                            first.is_some() && special_id(&pair[0]) == first.as_deref(),
                        );
                        let stop = if last.is_some()
                            && special_id(&pair[pair.len() - 1]) == last.as_deref()
                        {
                            pair.len() - 1
                        } else {
                            pair.len()
                        };
                        let pair = pair.get(start..stop.max(start)).unwrap_or(&[]);
                        if !pair.is_empty() {
                            let (a, b) =
                                (sequence_id(&pair[0]), sequence_id(&pair[pair.len() - 1]));
                            let middle = if pair.len() >= 2 {
                                &pair[1..pair.len() - 1]
                            } else {
                                &[][..]
                            };
                            if a == Some("A") && b == Some("B") && !middle.is_empty() {
                                let mut add_sep = false;
                                if let Some(e) = special_id(&middle[0]) {
                                    if is_one_of(e, &[&sep, &eos]) && last.is_none() {
                                        add_sep = true;
                                    }
                                }
                                if middle.len() == 2 {
                                    if let Some(e) = special_id(&middle[1]) {
                                        if is_one_of(e, &[&sep, &eos]) {
                                            add_sep = true;
                                        }
                                    }
                                }
                                sp.set_add("sep", add_sep);
                                if add_sep && !truthy(&sep) && has_tc {
                                    tc.insert("sep_token".into(), eos.clone());
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    if has_tc {
        from_tokenizer_config(&mut sp, &tc, added, files)?;
    }
    for typ in sp.types.clone() {
        sp.set_id(
            typ,
            "config.json",
            config(&format!("{typ}_token_id")).as_ref(),
        )?;
    }
    Ok(sp)
}

/// The chat template and the tokenizer_config.json entries.
fn from_tokenizer_config(
    sp: &mut Special,
    tc: &Map<String, Json>,
    added: &[AddedToken],
    files: &TokenizerFiles,
) -> Result<(), ToGgufError> {
    let alt = match (&files.chat_template_jinja, &files.chat_template_json) {
        (Some(_), _) if files.additional_chat_templates => {
            return Err(ToGgufError::UnsupportedTokenizer {
                what: "additional_chat_templates/".into(),
                why: "named chat templates beside chat_template.jinja are not written".into(),
            })
        }
        (Some(jinja), _) => Json::String(jinja.clone()),
        (None, Some(json)) => {
            let v: Json = serde_json::from_str(json).map_err(|e| ToGgufError::Json {
                file: "chat_template.json",
                why: e.to_string(),
            })?;
            v.get("chat_template").cloned().unwrap_or(Json::Null)
        }
        (None, None) => Json::Null,
    };
    let chat = tc.get("chat_template").cloned().unwrap_or(alt);
    if matches!(chat, Json::String(_) | Json::Array(_)) {
        sp.chat = Some(chat);
    }
    for typ in sp.types.clone() {
        if let Some(Json::Bool(b)) = tc.get(&format!("add_{typ}_token")) {
            sp.add_default(typ, *b);
        }
        let content = match tc.get(&format!("{typ}_token")) {
            Some(Json::String(s)) => s.as_str(),
            Some(Json::Object(o)) => match o.get("content") {
                Some(Json::String(s)) => s.as_str(),
                _ => continue,
            },
            _ => continue,
        };
        let id = added
            .iter()
            .find(|a| a.content == content)
            .map(|a| Json::from(a.id));
        sp.set_id(typ, "tokenizer_config.json", id.as_ref())?;
    }
    Ok(())
}

/// `SpecialVocab.add_to_gguf` after the merges: ids and add flags (the
/// types gguf-py has a writer method for), then the chat template.
pub(super) fn write(sp: &Special, kv: &mut Kvs) {
    for &(typ, id) in &sp.ids {
        let key = match typ {
            "bos" => "bos_token_id",
            "eos" => "eos_token_id",
            "unk" => "unknown_token_id",
            "sep" => "seperator_token_id",
            "pad" => "padding_token_id",
            "mask" => "mask_token_id",
            "eot" => "eot_token_id",
            "eom" => "eom_token_id",
            _ => continue, // cls: gguf-py has no add_cls_token_id
        };
        kv.u32(format!("tokenizer.ggml.{key}"), id);
    }
    for &(typ, v) in &sp.add {
        if matches!(typ, "bos" | "eos" | "sep") {
            kv.bool(format!("tokenizer.ggml.add_{typ}_token"), v);
        }
    }
    match &sp.chat {
        Some(Json::String(t)) => kv.string("tokenizer.chat_template", t),
        Some(Json::Array(choices)) => {
            // GGUFWriter.add_chat_template with named templates.
            let mut default = None;
            let mut names = Vec::new();
            for c in choices {
                let name: String = c
                    .get("name")
                    .and_then(Json::as_str)
                    .unwrap_or("")
                    .chars()
                    .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
                    .collect();
                let Some(t) = c.get("template").and_then(Json::as_str) else {
                    continue;
                };
                if name.is_empty() {
                    continue;
                }
                if name == "default" {
                    default = Some(t);
                } else {
                    kv.string(format!("tokenizer.chat_template.{name}"), t);
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
            // gguf-py writes a Python set here, in no fixed order; sorted.
            names.sort();
            let mut list = crate::format::gguf::value::Strings::default();
            names.iter().for_each(|n| list.push(n.as_bytes()));
            kv.strings("tokenizer.chat_templates", list);
            if let Some(t) = default {
                kv.string("tokenizer.chat_template", t);
            }
        }
        _ => {}
    }
}
