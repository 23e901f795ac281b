//! Structured output: a JSON schema (or a Lark grammar) compiled by
//! [llguidance](https://github.com/guidance-ai/llguidance) into a
//! [`TokenConstraint`] that masks what may be sampled next.
//!
//! - [`GrammarEngine`] is built once per tokenizer ([`GrammarEngine::new`]):
//!   every id's bytes ([`TextTokenizer`]'s spellings; special tokens are
//!   marked so that grammar text never matches them), the EOS ids, and the
//!   model's vocabulary size (ids past the tokenizer's are never allowed).
//! - [`GrammarSpec`] says what to compile: `response_format`'s
//!   [`JsonObject`](GrammarSpec::JsonObject) (any JSON object) and
//!   [`JsonSchema`](GrammarSpec::JsonSchema) (with `strict`), a raw
//!   [`Lark`](GrammarSpec::Lark) grammar, or built with
//!   [`GrammarSpec::tool_call`] (a call `{"name": ..., "arguments": ...}` to
//!   one of the given tools, its arguments validating against that tool's
//!   parameters, optionally between a text prefix and suffix such as
//!   `<tool_call>` ... `</tool_call>`).
//! - [`GrammarEngine::compile`] checks the size limit
//!   ([`MAX_GRAMMAR_BYTES`]) and compiles, before anything is generated;
//!   every refusal is a [`GrammarError`] (as an [`EngineError`]:
//!   `invalid response_format: ...`).
//! - [`GrammarConstraint`] is one request's state: `allowed` is llguidance's
//!   token mask (EOS allowed where the grammar may end), `commit` advances
//!   the parser, `is_done` once the grammar is complete and nothing may
//!   follow (or EOS was committed). It is `Clone`: a compiled schema can be
//!   kept and cloned for each request that uses it.
//!
//! JSON is written compactly (`", "` between items, `": "` after keys, no
//! other whitespace), so a model cannot pad its output with whitespace
//! forever. `strict: true` refuses a schema with a keyword llguidance does
//! not enforce (its guarantee would not hold); `strict: false` ignores such
//! keywords (llguidance's `lenient`) and enforces the rest.

mod env;
mod k3_arguments;
mod tool_call;

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value as Json};
use toktrie::TokEnv;

use crate::constraint::{ConstraintError, TokenConstraint};
use crate::error::EngineError;
use crate::tokenizer::TextTokenizer;

/// Largest schema (its JSON text) or Lark grammar accepted: 64 KiB. Larger
/// ones are refused before compiling (llguidance's own limits, its
/// defaults, bound the work a smaller one may cause: grammar size, lexer
/// fuel at compile and per token, Earley items per token).
pub const MAX_GRAMMAR_BYTES: usize = 64 * 1024;

/// Why a grammar was refused (before generation starts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// The schema or grammar text is over [`MAX_GRAMMAR_BYTES`].
    #[error("the {what} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { what: &'static str, size: usize, limit: usize },
    /// Not a schema at all (e.g. a JSON schema that is neither an object nor a boolean).
    #[error("{0}")]
    Malformed(String),
    /// llguidance could not compile it (its message: an unsupported or
    /// unsatisfiable schema, a Lark syntax error, one of its limits).
    #[error("the grammar engine cannot compile it: {0}")]
    Compile(String),
}

impl GrammarError {
    /// This refusal as the engine's error for request field `field`
    /// (`"response_format"`, `"tools"`, `"tool_choice"`).
    pub fn for_field(self, field: &'static str) -> EngineError {
        EngineError::Invalid {
            field,
            message: self.to_string(),
        }
    }
}

impl From<GrammarError> for EngineError {
    /// A refused `response_format`.
    fn from(e: GrammarError) -> Self {
        e.for_field("response_format")
    }
}

/// What to constrain output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// `response_format: {"type": "json_object"}`: any JSON object.
    JsonObject,
    /// `response_format: {"type": "json_schema", "json_schema": {"schema", "strict"}}`.
    JsonSchema { schema: Json, strict: bool },
    /// A grammar in llguidance's Lark dialect (`%json { schema }` embeds a
    /// JSON schema; `<|name|>` names a special token).
    Lark(String),
}

/// One tool a [`GrammarSpec::tool_call`] may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSchema {
    pub name: String,
    /// The tool's `parameters` JSON schema (`None`: any object).
    pub parameters: Option<Json>,
}

impl GrammarSpec {
    /// A call to one of `tools`: the JSON object `{"name": <a tool's name>,
    /// "arguments": <an object validating against that tool's
    /// parameters>}` (one `anyOf` branch per tool), between `prefix` and
    /// `suffix` text when given (e.g. `"<tool_call>\n"`, `"\n</tool_call>"`).
    /// `strict` as for a JSON schema (OpenAI's `function.strict`: with it, a
    /// parameter keyword llguidance does not enforce is refused; without,
    /// ignored).
    pub fn tool_call(tools: &[ToolSchema], wrap: Option<(&str, &str)>, strict: bool) -> Result<GrammarSpec, GrammarError> {
        if tools.is_empty() {
            return Err(GrammarError::Malformed("a tool call needs at least one tool".into()));
        }
        let branches: Vec<Json> = tools
            .iter()
            .map(|t| {
                let parameters = t.parameters.clone().unwrap_or_else(|| json!({"type": "object"}));
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = if branches.len() == 1 {
            branches.into_iter().next().unwrap_or_default()
        } else {
            json!({"anyOf": branches})
        };
        Ok(match wrap {
            None => GrammarSpec::JsonSchema { schema, strict },
            Some((prefix, suffix)) => GrammarSpec::json_between(prefix, schema, suffix, strict)?,
        })
    }

    /// `schema`'s JSON between the texts `prefix` and `suffix`, as a Lark
    /// grammar.
    pub fn json_between(prefix: &str, schema: Json, suffix: &str, strict: bool) -> Result<GrammarSpec, GrammarError> {
        let schema = with_options(schema, strict)?;
        let mut start = String::from("start:");
        for part in [quoted(prefix), "body".into(), quoted(suffix)] {
            if part != "\"\"" {
                start.push(' ');
                start.push_str(&part);
            }
        }
        Ok(GrammarSpec::Lark(format!("{start}\nbody: %json {schema}\n")))
    }
}

/// A Lark string literal of `text` (JSON's escapes are Lark's).
fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// `schema` with larder's JSON options (compact separators, no free
/// whitespace; `lenient` unless `strict`) in its `x-guidance` field.
fn with_options(schema: Json, strict: bool) -> Result<Json, GrammarError> {
    let mut schema = match schema {
        Json::Object(map) => map,
        Json::Bool(true) => serde_json::Map::new(),
        Json::Bool(false) => return Err(GrammarError::Malformed("the schema `false` accepts nothing".into())),
        other => {
            return Err(GrammarError::Malformed(format!(
                "a JSON schema is an object or a boolean, not {}",
                kind_of(&other)
            )))
        }
    };
    schema.insert(
        "x-guidance".into(),
        json!({
            "item_separator": ", ",
            "key_separator": ": ",
            "whitespace_flexible": false,
            "lenient": !strict,
        }),
    );
    Ok(Json::Object(schema))
}

fn kind_of(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// One tokenizer's grammar engine: its token trie and llguidance's parser
/// factory (built once, shared by every request's constraint).
pub struct GrammarEngine {
    factory: Arc<ParserFactory>,
    eos: Arc<[u32]>,
    vocab_size: usize,
}

impl GrammarEngine {
    /// The engine for `tokenizer`, whose EOS ids are `eos_ids` (at least one),
    /// for a model of `vocab_size` ids (at least the tokenizer's own).
    pub fn new(tokenizer: &TextTokenizer, eos_ids: &[u32], vocab_size: usize) -> Result<Self, EngineError> {
        let env: TokEnv = env::token_env(tokenizer, eos_ids, vocab_size)?;
        let vocab_size = env.tok_trie().vocab_size();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| EngineError::Tokenizer(format!("the grammar engine's token trie: {e}")))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(GrammarEngine {
            factory: Arc::new(factory),
            eos: eos_ids.into(),
            vocab_size,
        })
    }

    /// Ids the masks cover (the model's vocabulary).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Compiles `spec` into a fresh constraint, or says why not (size,
    /// shape, or llguidance's own message).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<GrammarConstraint, GrammarError> {
        let grammar = match spec {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(with_options(json!({"type": "object"}), true)?),
            GrammarSpec::JsonSchema { schema, strict } => {
                let size = serde_json::to_string(schema).map(|s| s.len()).unwrap_or(usize::MAX);
                check_size("JSON schema", size)?;
                TopLevelGrammar::from_json_schema(with_options(schema.clone(), *strict)?)
            }
            GrammarSpec::Lark(text) => {
                check_size("Lark grammar", text.len())?;
                TopLevelGrammar::from_lark(text.clone())
            }
        };
        // llguidance's own guard: a panic while compiling becomes an error.
        let factory = &self.factory;
        let parser = llguidance::panic_utils::catch_unwind(std::panic::AssertUnwindSafe(|| factory.create_parser(grammar)))
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(e));
        }
        Ok(GrammarConstraint {
            matcher,
            eos: self.eos.clone(),
            eos_committed: false,
        })
    }
}

fn check_size(what: &'static str, size: usize) -> Result<(), GrammarError> {
    if size > MAX_GRAMMAR_BYTES {
        return Err(GrammarError::TooLarge {
            what,
            size,
            limit: MAX_GRAMMAR_BYTES,
        });
    }
    Ok(())
}

/// One request's grammar state (see the module docs).
#[derive(Clone)]
pub struct GrammarConstraint {
    matcher: Matcher,
    eos: Arc<[u32]>,
    eos_committed: bool,
}

impl GrammarConstraint {
    fn error(&self, what: &str, e: impl std::fmt::Display) -> ConstraintError {
        ConstraintError(format!("structured output: {what}: {e}"))
    }
}

impl TokenConstraint for GrammarConstraint {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), ConstraintError> {
        let mask = self.matcher.compute_mask().map_err(|e| self.error("computing the token mask", e))?;
        mask.iter_set_entries(|id| {
            if let Some(slot) = allowed.get_mut(id) {
                *slot = true;
            }
        });
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.eos.contains(&token) {
            let accepting = self.matcher.is_accepting().map_err(|e| self.error("ending", e))?;
            if !accepting {
                return Err(self.error("ending", "end of sequence before the output is complete"));
            }
            self.eos_committed = true;
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| self.error(&format!("token {token}"), e))
    }

    fn is_done(&self) -> bool {
        self.eos_committed || self.matcher.is_stopped()
    }
}

impl std::fmt::Debug for GrammarConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrammarConstraint")
    }
}
