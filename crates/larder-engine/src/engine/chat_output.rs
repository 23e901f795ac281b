//! What serving a chat needs of the engine besides its prompt: the reader of
//! the output ([`OutputReader`]: reasoning, content and tool calls, and
//! whether the text must spell special tokens for it), the checkpoint's
//! tool-call family, and the grammar that forces a tool call in that
//! family's syntax (`tool_choice: "required"` or a named function), and the
//! constraint that enforces a `max_reasoning_tokens` budget.

use crate::chat::ChatFormat;
use crate::error::EngineError;
use crate::grammar::{GrammarConstraint, GrammarSpec, ToolSchema};
use crate::reasoning::BudgetConstraint;
use crate::tokenizer::TextTokenizer;
use crate::tool_calls::{OutputParser, ToolFamily};

use super::Engine;

/// How to read what a model writes after one prompt.
pub struct OutputReader {
    /// Splits the text into reasoning, content and (when tools are on) calls.
    pub parser: Box<dyn OutputParser>,
    /// The text must spell special tokens (the job's
    /// [`keep_special_tokens`](crate::Job::keep_special_tokens)): the
    /// markers the parser reads are special tokens.
    pub keep_special_tokens: bool,
}

impl Engine {
    /// The tool-call family this checkpoint writes (`None`: larder knows
    /// none for it).
    pub fn tool_family(&self) -> Option<ToolFamily> {
        match self.chat_format().ok()? {
            ChatFormat::Template(t) => t.tool_family(),
            ChatFormat::KimiK3 => Some(ToolFamily::KimiK3),
        }
    }

    /// The reader of the output generated after `prompt` (a render of this
    /// checkpoint's chat format), tool calls parsed only when `tools` (the
    /// request offered tools the model may call). gpt-oss's harmony channels
    /// and Kimi K3's tags are special tokens, so their text keeps them;
    /// the other families' when their tool-call markers are.
    pub fn output_reader(&self, prompt: &str, tools: bool) -> Result<OutputReader, EngineError> {
        use crate::kimi_k3_chat::{OPEN, SEP};
        Ok(match self.chat_format()? {
            ChatFormat::Template(t) => {
                let family = t.tool_family();
                let markers_special = match (family, self.tokenizer.as_ref()) {
                    (Some(f), Some(tok)) => f.markers().iter().any(|m| special_id(tok, m).is_some()),
                    _ => false,
                };
                OutputReader {
                    parser: t.reader(prompt, tools),
                    keep_special_tokens: family == Some(ToolFamily::Harmony) || (tools && markers_special),
                }
            }
            ChatFormat::KimiK3 => OutputReader {
                parser: crate::reasoning::kimi_k3(prompt.ends_with(&format!("{OPEN}think{SEP}")), tools),
                keep_special_tokens: true,
            },
        })
    }

    /// A `max_reasoning_tokens` budget of `max` tokens for the output
    /// generated after `prompt` (a render of this checkpoint's chat
    /// format): `<think>` ... `</think>` for templates that write it,
    /// gpt-oss's analysis channel (closed by `<|end|>`), Kimi K3's `think`
    /// tag; an error naming `max_reasoning_tokens` for a model that does not
    /// reason in a form larder reads.
    pub fn reasoning_budget(&self, prompt: &str, max: usize) -> Result<BudgetConstraint, EngineError> {
        use crate::kimi_k3_chat::{CLOSE, OPEN, SEP};
        use crate::reasoning::{prompt_opens, ReasoningBudget, THINK_CLOSE, THINK_OPEN};
        let tok = self.tokenizer()?;
        let ids = |text: &str| tok.encode(text, false);
        let (open, close, starts_open) = match self.chat_format()? {
            ChatFormat::KimiK3 => {
                let open = format!("{OPEN}think{SEP}");
                let close = tok.encode_segment(&format!("{CLOSE}think{SEP}"), true)?;
                (tok.encode_segment(&open, true)?, close, prompt.ends_with(&open))
            }
            ChatFormat::Template(t) if t.tool_family() == Some(ToolFamily::Harmony) => {
                (ids("<|channel|>analysis<|message|>")?, ids("<|end|>")?, false)
            }
            ChatFormat::Template(t) if t.thinks() => {
                (ids(THINK_OPEN)?, ids(THINK_CLOSE)?, prompt_opens(prompt, THINK_OPEN, THINK_CLOSE))
            }
            ChatFormat::Template(_) => {
                return Err(EngineError::Invalid {
                    field: "max_reasoning_tokens",
                    message: "this model's chat template writes no reasoning larder can read (<think>, gpt-oss's analysis channel, Kimi K3's think tag)".into(),
                })
            }
        };
        Ok(BudgetConstraint::new(ReasoningBudget::new(open, close, starts_open, Some(max))))
    }

    /// A constraint forcing one call, in this checkpoint's tool-call
    /// syntax, to one of `tools` (its arguments valid against that tool's
    /// parameters), in the output after `prompt` (a render of this
    /// checkpoint's chat format); an error naming `tools` when the
    /// checkpoint has no known family or the grammar does not compile.
    pub fn tool_call_constraint(&self, prompt: &str, tools: &[ToolSchema], strict: bool) -> Result<GrammarConstraint, EngineError> {
        use crate::kimi_k3_chat::{OPEN, SEP};
        let family = self.tool_family().ok_or_else(|| EngineError::Invalid {
            field: "tool_choice",
            message: "larder knows no tool-call format for this model, so it cannot force a call".into(),
        })?;
        let tok = self.tokenizer()?;
        let opened_think = prompt.ends_with(&format!("{OPEN}think{SEP}"));
        let spec = GrammarSpec::family_tool_call(family, tools, strict, &|m| special_id(tok, m), opened_think)
            .map_err(|e| e.for_field("tools"))?;
        let grammar = self.grammar().map_err(|e| match e {
            EngineError::Invalid { message, .. } => EngineError::Invalid { field: "tools", message },
            e => e,
        })?;
        grammar.compile(&spec).map_err(|e| e.for_field("tools"))
    }
}

/// The id of `marker` when it is one special token of `tok` (left out of
/// text decoded without special tokens).
fn special_id(tok: &TextTokenizer, marker: &str) -> Option<u32> {
    let id = tok.token_to_id(marker)?;
    tok.decode(&[id], true).ok().filter(|text| text.is_empty()).map(|_| id)
}
