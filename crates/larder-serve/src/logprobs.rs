//! Logprobs in OpenAI's shapes: a generated token's logprob as the HTTP side
//! holds it ([`Logprob`]: token and alternatives spelled by the tokenizer),
//! chat's `choices[i].logprobs` (`{"content": [{token, logprob, bytes,
//! top_logprobs}], "refusal": null}`) and completions' (`{tokens,
//! token_logprobs, top_logprobs, text_offset}`), whole or per streamed chunk.
//!
//! The numbers are the engine's: the log-softmax of the model's own f32
//! logits at each position (before `logit_bias`, penalties, temperature and
//! top-k/top-p), so they equal `larder forward`'s whatever the batching or
//! drafting. A token's text is the tokenizer's decoding of that one id (a
//! byte-level token that is part of a UTF-8 character decodes to U+FFFD), and
//! `bytes` is that text's UTF-8.

use larder_engine::{Engine, TokenLogprob};
use serde_json::{json, Map, Value};

/// A generated token's logprob and its alternatives, spelled.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    pub token: String,
    pub logprob: f32,
    /// The most likely tokens at its position, most likely first.
    pub top: Vec<(String, f32)>,
}

impl Logprob {
    /// `lp` with its tokens spelled by `engine`'s tokenizer (`token_id:N`
    /// when the model has none).
    pub fn spelled(engine: &Engine, lp: &TokenLogprob) -> Logprob {
        let spell = |id: u32| match engine.tokenizer() {
            Ok(tok) => tok.decode(&[id], false).unwrap_or_else(|_| format!("token_id:{id}")),
            Err(_) => format!("token_id:{id}"),
        };
        Logprob {
            token: spell(lp.token),
            logprob: lp.logprob,
            top: lp.top.iter().map(|&(id, l)| (spell(id), l)).collect(),
        }
    }
}

/// Chat's `logprobs` of a choice (or of a streamed chunk) holding `tokens`.
pub fn chat(tokens: &[Logprob]) -> Value {
    let entry = |token: &str, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(s, l)| entry(s, *l)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `logprobs` of a choice (or of a streamed chunk) holding
/// `tokens`, the first at character `offset` of the completion's text.
pub fn completion(tokens: &[Logprob], offset: usize) -> Value {
    let mut at = offset;
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in tokens {
        text_offset.push(at);
        at += t.token.chars().count();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| Value::Object(t.top.iter().map(|(s, l)| (s.clone(), json!(l))).collect::<Map<_, _>>()))
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: &str, logprob: f32, top: &[(&str, f32)]) -> Logprob {
        Logprob {
            token: token.into(),
            logprob,
            top: top.iter().map(|&(s, l)| (s.to_string(), l)).collect(),
        }
    }

    #[test]
    fn shapes_are_openai_s() {
        let tokens = [lp("Hé", -0.5, &[("Hé", -0.5), ("x", -1.25)]), lp("!", -2.0, &[])];
        let c = chat(&tokens);
        assert_eq!(c["content"][0]["bytes"], json!([72, 195, 169]));
        assert_eq!(
            c["content"][0]["top_logprobs"][1],
            json!({"token": "x", "logprob": -1.25, "bytes": [120]})
        );
        assert_eq!(c["content"][1]["top_logprobs"], json!([]));
        assert_eq!(c["refusal"], Value::Null);
        let p = completion(&tokens, 3);
        assert_eq!(p["tokens"], json!(["Hé", "!"]));
        assert_eq!(p["token_logprobs"], json!([-0.5, -2.0]));
        assert_eq!(p["top_logprobs"][0], json!({"Hé": -0.5, "x": -1.25}));
        assert_eq!(p["text_offset"], json!([3, 5]));
    }
}
