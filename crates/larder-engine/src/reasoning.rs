//! Reasoning apart from the answer: a thinking model's output split into
//! `reasoning_content` and `content` (then content into tool calls by the
//! family's [`crate::tool_calls`] parser), whole or streamed through
//! [`crate::tool_calls::StreamParser`]; and [`ReasoningBudget`], which counts
//! reasoning tokens for a `max_reasoning_tokens` budget, enforced by
//! [`BudgetConstraint`] (`Engine::reasoning_budget` builds one per prompt).
//!
//! Formats ([`ReasoningFormat`]):
//! - `<think>REASONING</think>CONTENT` (Qwen3; DeepSeek-R1 and Kimi-K2's
//!   thinking models the same): when the prompt already opened `<think>`
//!   (DeepSeek-R1's template, Qwen3-Thinking-2507's), the output starts in
//!   reasoning ([`prompt_opens`]); else reasoning only when the output
//!   starts with `<think>`. An unclosed block is all reasoning (output cut
//!   by `max_tokens`). Content after `</think>` is kept as written (vLLM's
//!   `Qwen3ReasoningParser` and `DeepSeekR1ReasoningParser`:
//!   `vllm/reasoning/qwen3_reasoning_parser.py`, `deepseek_r1_reasoning_parser.py`,
//!   partition on `</think>`).
//! - gpt-oss: the harmony channels, read by [`crate::tool_calls::harmony`]
//!   (analysis is reasoning).
//! - Kimi K3: `<|open|>think<|sep|>REASONING<|close|>think<|sep|>` then
//!   `<|open|>response<|sep|>CONTENT<|close|>response<|sep|>`, the tags
//!   [`crate::kimi_k3_chat`] builds for past assistant messages; the
//!   generation prompt opens `think` (thinking on) or `response` (off).
//!
//! Not built: Kimi-VL's `◁think▷` (no MoE checkpoint larder runs writes it).

use crate::constraint::{ConstraintError, TokenConstraint};
use crate::kimi_k3_chat::{CLOSE, OPEN, SEP};
use crate::tool_calls::kimi_k3::K3Response;
use crate::tool_calls::{held_back, OutputParser, ParsedOutput, ToolFamily};

/// Where a checkpoint's output puts its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// No reasoning: all content.
    None,
    /// `<think>...</think>`; `starts_open` when the prompt opened it.
    Think { starts_open: bool },
    /// Kimi K3's `think` and `response` tags; `thinking` as the prompt was
    /// built.
    KimiK3 { thinking: bool },
}

/// The whole reader of a checkpoint's output: reasoning split off, then
/// tool calls parsed from the content (`tools` `None`: content as is).
/// gpt-oss's harmony reader does both, whatever `reasoning` says.
pub fn output_parser(tools: Option<ToolFamily>, reasoning: ReasoningFormat) -> Box<dyn OutputParser> {
    if tools == Some(ToolFamily::Harmony) {
        return ToolFamily::Harmony.parser();
    }
    let then = tools.map(ToolFamily::parser);
    match reasoning {
        ReasoningFormat::None => then.unwrap_or_else(|| Box::new(Plain)),
        ReasoningFormat::Think { starts_open } => Box::new(ThinkSplit::think(starts_open, then)),
        ReasoningFormat::KimiK3 { thinking } => kimi_k3(thinking, tools == Some(ToolFamily::KimiK3)),
    }
}

/// All content.
pub struct Plain;

impl OutputParser for Plain {
    fn parse(&self, text: &str) -> ParsedOutput {
        ParsedOutput::content(text)
    }

    fn parse_partial(&self, text: &str) -> ParsedOutput {
        ParsedOutput::content(text)
    }
}

/// `<think>`.
pub const THINK_OPEN: &str = "<think>";
/// `</think>`.
pub const THINK_CLOSE: &str = "</think>";

/// Whether a rendered prompt leaves a `<think>` block open (the template's
/// generation prompt opened it, so the output starts in reasoning).
pub fn prompt_opens(prompt: &str, open: &str, close: &str) -> bool {
    match (prompt.rfind(open), prompt.rfind(close)) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Reasoning in `open ... close` before the content, content read by `then`.
pub struct ThinkSplit {
    pub open: String,
    pub close: String,
    /// The prompt opened the block: the output starts in reasoning.
    pub starts_open: bool,
    /// Reads the content (tool calls), or takes it as is.
    pub then: Option<Box<dyn OutputParser>>,
}

impl ThinkSplit {
    /// `<think>...</think>`.
    pub fn think(starts_open: bool, then: Option<Box<dyn OutputParser>>) -> Self {
        ThinkSplit {
            open: THINK_OPEN.into(),
            close: THINK_CLOSE.into(),
            starts_open,
            then,
        }
    }

    fn content(&self, text: &str, finished: bool) -> ParsedOutput {
        match (&self.then, finished) {
            (Some(p), true) => p.parse(text),
            (Some(p), false) => p.parse_partial(text),
            (None, _) => ParsedOutput::content(text),
        }
    }

    fn read(&self, text: &str, finished: bool) -> ParsedOutput {
        let inner = if self.starts_open {
            text
        } else if let Some(after) = text.strip_prefix(self.open.as_str()) {
            after
        } else if !finished && self.open.starts_with(text) {
            return ParsedOutput::default();
        } else {
            return self.content(text, finished);
        };
        match inner.split_once(self.close.as_str()) {
            Some((reasoning, rest)) => {
                let mut out = self.content(rest, finished);
                out.reasoning = format!("{reasoning}{}", out.reasoning);
                out
            }
            None => {
                let keep = if finished { 0 } else { held_back(inner, &[&self.close]) };
                ParsedOutput {
                    reasoning: inner[..inner.len() - keep].to_string(),
                    ..Default::default()
                }
            }
        }
    }
}

impl OutputParser for ThinkSplit {
    fn parse(&self, text: &str) -> ParsedOutput {
        self.read(text, true)
    }

    fn parse_partial(&self, text: &str) -> ParsedOutput {
        self.read(text, false)
    }
}

/// Kimi K3's output parser: thinking on, the prompt opened `think`; off,
/// it opened `response`; tool calls read when `calls`.
pub fn kimi_k3(thinking: bool, calls: bool) -> Box<dyn OutputParser> {
    if thinking {
        Box::new(ThinkSplit {
            open: format!("{OPEN}think{SEP}"),
            close: format!("{CLOSE}think{SEP}"),
            starts_open: true,
            then: Some(Box::new(K3Response { opened: false, calls })),
        })
    } else {
        Box::new(K3Response { opened: true, calls })
    }
}

/// Counts the reasoning tokens of a generation, token by token, and says
/// when a `max_reasoning_tokens` budget is spent: the caller then feeds the
/// end-of-reasoning ids ([`ReasoningBudget::forced`]) instead of sampling,
/// so the model goes on to answer.
#[derive(Debug, Clone)]
pub struct ReasoningBudget {
    open: Vec<u32>,
    close: Vec<u32>,
    max: Option<usize>,
    in_reasoning: bool,
    count: usize,
    tail: Vec<u32>,
}

impl ReasoningBudget {
    /// `open`/`close`: the token ids of the format's markers (`<think>`,
    /// `</think>`: one id each in Qwen3 and DeepSeek-R1); `starts_open` as
    /// [`prompt_opens`] says; `max`: the budget (`None`: count only).
    pub fn new(open: Vec<u32>, close: Vec<u32>, starts_open: bool, max: Option<usize>) -> Self {
        ReasoningBudget {
            open,
            close,
            max,
            in_reasoning: starts_open,
            count: 0,
            tail: Vec::new(),
        }
    }

    /// One generated id.
    pub fn observe(&mut self, id: u32) {
        self.tail.push(id);
        let keep = self.open.len().max(self.close.len());
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        if self.in_reasoning {
            if !self.close.is_empty() && self.tail.ends_with(&self.close) {
                self.in_reasoning = false;
                // The close marker's other ids were counted as reasoning.
                self.count -= (self.close.len() - 1).min(self.count);
            } else {
                self.count += 1;
            }
        } else if !self.open.is_empty() && self.tail.ends_with(&self.open) && self.count == 0 {
            self.in_reasoning = true;
        }
    }

    /// Reasoning tokens so far (markers not counted).
    pub fn reasoning_tokens(&self) -> usize {
        self.count
    }

    /// Whether the generation is inside its reasoning now.
    pub fn in_reasoning(&self) -> bool {
        self.in_reasoning
    }

    /// The ids to feed next instead of sampling: the close marker, once the
    /// budget is spent inside the reasoning.
    pub fn forced(&self) -> Option<&[u32]> {
        match self.max {
            Some(max) if self.in_reasoning && self.count >= max => Some(&self.close),
            _ => None,
        }
    }
}

/// A `max_reasoning_tokens` budget as a [`TokenConstraint`]: any token may
/// come next, except once the budget is spent inside the reasoning: then
/// only the close marker's ids, one by one, so the model goes on to answer.
/// The model's logits are never changed; the mask only narrows what may be
/// sampled, as any constraint does.
#[derive(Debug, Clone)]
pub struct BudgetConstraint {
    budget: ReasoningBudget,
    /// Ids of the close marker already forced.
    forced: usize,
}

impl BudgetConstraint {
    pub fn new(budget: ReasoningBudget) -> Self {
        BudgetConstraint { budget, forced: 0 }
    }
}

impl TokenConstraint for BudgetConstraint {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), ConstraintError> {
        match self.budget.forced().and_then(|close| close.get(self.forced)) {
            Some(&id) => match allowed.get_mut(id as usize) {
                Some(slot) => *slot = true,
                None => {
                    return Err(ConstraintError(format!(
                        "the reasoning close marker's id {id} is past the vocabulary"
                    )))
                }
            },
            None => allowed.fill(true),
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        let forcing = self.budget.forced().is_some();
        self.budget.observe(token);
        self.forced = match (forcing, self.budget.forced().is_some()) {
            (true, true) => self.forced + 1,
            _ => 0,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_forces_the_close_marker_id_by_id() {
        let mut c = BudgetConstraint::new(ReasoningBudget::new(vec![1], vec![4, 5], true, Some(2)));
        let mut mask = vec![false; 8];
        let mut step = |c: &mut BudgetConstraint, id: u32| {
            mask.fill(false);
            c.allowed(&mut mask).unwrap();
            let allowed: Vec<usize> = (0..8).filter(|&i| mask[i]).collect();
            c.commit(id).unwrap();
            allowed
        };
        assert_eq!(step(&mut c, 7).len(), 8);
        assert_eq!(step(&mut c, 7).len(), 8);
        assert_eq!(step(&mut c, 4), vec![4]);
        assert_eq!(step(&mut c, 5), vec![5]);
        assert_eq!(step(&mut c, 6).len(), 8, "answering: free again");
        assert_eq!(step(&mut c, 1).len(), 8, "no second reasoning block is budgeted");
    }

    #[test]
    fn budget_counts_and_forces_the_close() {
        let mut b = ReasoningBudget::new(vec![1], vec![2], false, Some(3));
        b.observe(1);
        assert!(b.in_reasoning() && b.forced().is_none());
        for id in [7, 8, 9] {
            b.observe(id);
        }
        assert_eq!(b.reasoning_tokens(), 3);
        assert_eq!(b.forced(), Some(&[2][..]));
        b.observe(2);
        assert!(!b.in_reasoning() && b.forced().is_none());
        b.observe(5);
        assert_eq!(b.reasoning_tokens(), 3);
    }

    #[test]
    fn budget_with_a_multi_id_close() {
        let mut b = ReasoningBudget::new(vec![], vec![4, 5], true, None);
        for id in [9, 9, 4, 5, 6] {
            b.observe(id);
        }
        assert_eq!(b.reasoning_tokens(), 2);
        assert!(!b.in_reasoning());
    }

    #[test]
    fn prompt_open_think() {
        assert!(prompt_opens("<|im_start|>assistant\n<think>\n", THINK_OPEN, THINK_CLOSE));
        assert!(!prompt_opens("<think>\n\n</think>\n\n", THINK_OPEN, THINK_CLOSE));
        assert!(!prompt_opens("hello", THINK_OPEN, THINK_CLOSE));
    }
}
