//! The tokenizer from a GGUF file's own `tokenizer.ggml.*` metadata: a
//! GPT-2 style byte-level BPE (`tokenizer.ggml.model = gpt2`) becomes a
//! HuggingFace tokenizer definition loaded by `ferrite-tokenizer`.
//!
//! - vocabulary: `tokenizer.ggml.tokens` (byte-level strings, id = index);
//! - merges: `tokenizer.ggml.merges` ("a b" strings, in rank order);
//! - special tokens: ids whose `tokenizer.ggml.token_type` is 3 (control)
//!   are matched in text and skipped when decoding with special tokens
//!   skipped; type 4 (user-defined) are matched but decoded as text;
//! - pre-tokenizer from `tokenizer.ggml.pre`: `smollm` (and the other
//!   names llama.cpp splits the same way) splits every digit on its own,
//!   then applies the GPT-2 word pattern; `gpt2` / `default` apply the
//!   GPT-2 pattern alone. Other names are refused, naming them.

use ferrite::{Result, Status, StatusCode};
use ferrite_tokenizer::Tokenizer;
use serde_json::{json, Map, Value as Json};

use crate::gguf::{GgufFile, MetaValue};

fn strings(file: &GgufFile, key: &str) -> Result<Vec<String>> {
    file.array(key)?
        .iter()
        .map(|v| match v {
            MetaValue::Str(s) => Ok(s.clone()),
            _ => Err(Status::new(
                StatusCode::InvalidArgument,
                format!("gguf metadata '{key}' holds a non-string"),
            )),
        })
        .collect()
}

/// The HuggingFace `tokenizer.json` text equivalent to the file's tokenizer.
pub fn tokenizer_json(file: &GgufFile) -> Result<String> {
    let model = file.str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(Status::new(
            StatusCode::Unimplemented,
            format!(
                "gguf tokenizer.ggml.model '{model}' is not supported (gpt2 byte-level BPE only)"
            ),
        ));
    }
    let pre = file.str("tokenizer.ggml.pre").unwrap_or("default");
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let pre_tokenizer = match pre {
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            json!({
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level]
            })
        }
        "gpt2" | "default" => byte_level,
        other => {
            return Err(Status::new(
                StatusCode::Unimplemented,
                format!(
                    "gguf tokenizer.ggml.pre '{other}' is not supported (smollm, gpt2, default)"
                ),
            ))
        }
    };
    let tokens = strings(file, "tokenizer.ggml.tokens")?;
    let merges = strings(file, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match file.array("tokenizer.ggml.token_type") {
        Ok(a) => a
            .iter()
            .map(|v| if let MetaValue::Int(i) = v { *i } else { 1 })
            .collect(),
        Err(_) => vec![1; tokens.len()],
    };
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        vocab.insert(tok.clone(), json!(id));
        let ty = types.get(id).copied().unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == 3
            }));
        }
    }
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Json::Object(vocab), "merges": merges
        }
    });
    Ok(doc.to_string())
}

/// The file's tokenizer.
pub fn load(file: &GgufFile) -> Result<Tokenizer> {
    Tokenizer::from_json(&tokenizer_json(file)?)
}
