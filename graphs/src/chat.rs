//! Chat prompt rendering with the model's own Jinja template
//! (`tokenizer.chat_template`, HF semantics via minijinja + pycompat), and safe
//! tokenization that keeps message contents from injecting control tokens.

use minijinja::{context, Environment, Error, ErrorKind};

use crate::gguf::GgufFile;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// ChatML, used when the model has no template or its template fails.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template failed to render: {0}")]
    Render(String),
    #[error("the chat template alters message contents, so they cannot be tokenized separately")]
    ContentAltered,
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
    warning: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("warning", &self.warning)
            .finish()
    }
}

fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn environment(source: &str) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    // HF apply_chat_template renders with trim_blocks and lstrip_blocks
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    minijinja_contrib::add_to_environment(&mut env);
    env.add_function("raise_exception", raise_exception);
    // compile once here to report syntax errors at load; rendering recompiles
    // from `source` (cheap, once per request) to avoid the `loader` feature
    env.template_from_str(source)?;
    Ok(env)
}

const OPEN: char = '\u{F8F0}';
const CLOSE: char = '\u{F8F1}';

/// Placeholder standing for message `i` while rendering the structure. Private
/// use code points do not occur in templates.
fn placeholder(i: usize) -> String {
    format!("{OPEN}{i}{CLOSE}")
}

impl ChatTemplate {
    /// The template from `tokenizer.chat_template`. If it is missing or fails
    /// to compile or render a sample conversation, ChatML is used instead and
    /// `warning()` says why.
    pub fn from_gguf(f: &GgufFile) -> Self {
        let token_text = |key: &str| -> String {
            let tokens = f.get("tokenizer.ggml.tokens").and_then(|v| v.as_array());
            f.get_u32(key)
                .and_then(|id| tokens?.get(id as usize)?.as_str().map(str::to_string))
                .unwrap_or_default()
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        match f.get_str("tokenizer.chat_template") {
            None => Self::chatml(bos, eos, "the model has no tokenizer.chat_template".into()),
            Some(src) => Self::from_source(src, &bos, &eos),
        }
    }

    /// A template from source, with ChatML as the fallback (see `from_gguf`).
    pub fn from_source(src: &str, bos: &str, eos: &str) -> Self {
        let attempt = environment(src).map(|env| ChatTemplate {
            env,
            source: src.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
            warning: None,
        });
        match attempt {
            Ok(t) => {
                let probe = [
                    ChatMessage::new("system", "s"),
                    ChatMessage::new("user", "u"),
                ];
                match t.render(&probe, true) {
                    Ok(_) => t,
                    Err(e) => Self::chatml(bos.into(), eos.into(), format!("{e}; using ChatML")),
                }
            }
            Err(e) => Self::chatml(
                bos.into(),
                eos.into(),
                format!("chat template does not compile: {e}; using ChatML"),
            ),
        }
    }

    pub fn chatml(bos: String, eos: String, warning: String) -> Self {
        ChatTemplate {
            env: environment(CHATML_TEMPLATE).expect("the built-in ChatML template compiles"),
            source: CHATML_TEMPLATE.to_string(),
            bos,
            eos,
            warning: Some(warning),
        }
    }

    /// Why the model's own template is not used, if it is not.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .template_from_str(&self.source)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
        })
        .map_err(|e| ChatError::Render(describe(&e)))
    }

    /// Token ids of the rendered conversation where the template's own text is
    /// tokenized with special tokens parsed and every message content with
    /// `parse_special = false`, so a document containing "<|im_end|>" can never
    /// close a turn. BOS is prepended when the tokenizer asks for it and the
    /// template did not already write it.
    pub fn encode_chat(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatError> {
        // Templates may trim contents (llama3 does `content | trim`): try the
        // contents as given, then trimmed, and accept whichever reproduces the
        // real rendering exactly.
        let real = self.render(messages, add_generation_prompt)?;
        let mut ids = None;
        for trim in [false, true] {
            let (found, spliced) = self.splice(tok, messages, add_generation_prompt, trim)?;
            if spliced == real {
                ids = Some(found);
                break;
            }
        }
        let mut ids = ids.ok_or(ChatError::ContentAltered)?;
        if tok.add_bos() {
            let bos = tok.bos_id().expect("add_bos implies a BOS id");
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }
}

impl ChatTemplate {
    /// Render with placeholders, then tokenize the template text (specials
    /// parsed) and the contents (plain) piece by piece. Returns the ids and the
    /// spliced text.
    fn splice(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        trim: bool,
    ) -> Result<(Vec<u32>, String), ChatError> {
        let masked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage {
                role: m.role.clone(),
                content: placeholder(i),
            })
            .collect();
        let skeleton = self.render(&masked, add_generation_prompt)?;
        let mut ids = Vec::new();
        let mut spliced = String::with_capacity(skeleton.len());
        let mut rest = skeleton.as_str();
        while let Some(start) = rest.find(OPEN) {
            let (before, tail) = rest.split_at(start);
            let end = tail.find(CLOSE).ok_or(ChatError::ContentAltered)?;
            let index: usize = tail[OPEN.len_utf8()..end]
                .parse()
                .map_err(|_| ChatError::ContentAltered)?;
            let msg = messages.get(index).ok_or(ChatError::ContentAltered)?;
            let content = if trim {
                msg.content.trim()
            } else {
                &msg.content
            };
            ids.extend(tok.encode(before, true)?);
            ids.extend(tok.encode(content, false)?);
            spliced.push_str(before);
            spliced.push_str(content);
            rest = &tail[end + CLOSE.len_utf8()..];
        }
        ids.extend(tok.encode(rest, true)?);
        spliced.push_str(rest);
        Ok((ids, spliced))
    }
}

/// minijinja errors carry their cause chain separately; include it.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
