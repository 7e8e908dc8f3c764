//! Conversations: `rag_chat` answers the last message of a caller's chat.

use crate::ask::{answer_to_c, ask_options, RagAnswer, RagAskOptions, RagTextCallback, Stream};
use crate::guard::{arg, contain};
use crate::handle::{handle, RagAssistant};
use rag::assistant::ChatMessage;
use rag::prompt::{chat_role, CHAT_ROLES};
use std::ffi::{c_char, c_void};

/// One message of a chat. Both strings are borrowed for the call.
#[repr(C)]
pub struct RagChatMessage {
    /// "system", "developer" (the same as "system"), "user" or "assistant".
    pub role: *const c_char,
    pub content: *const c_char,
}

/// The caller's `n` messages, checked.
fn messages(ptr: *const RagChatMessage, n: usize) -> anyhow::Result<Vec<ChatMessage>> {
    anyhow::ensure!(n > 0, "the chat has no messages (n_messages is 0)");
    anyhow::ensure!(!ptr.is_null(), "messages is NULL");
    // SAFETY: not NULL, and the caller passes `n` messages that live for the call.
    let list = unsafe { std::slice::from_raw_parts(ptr, n) };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let role = arg(m.role, &format!("messages[{i}].role"))?;
            let role = chat_role(role).ok_or_else(|| {
                anyhow::anyhow!("messages[{i}] has the unknown role {role:?} (roles: {CHAT_ROLES})")
            })?;
            let content = arg(m.content, &format!("messages[{i}].content"))?;
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// Answers the last of `n_messages` messages (system message, earlier turns, the question
/// last) with the earlier turns in the prompt, streaming the answer as `rag_ask` does.
///
/// With `retrieve`, the last message must be the user's: passages are searched with it and
/// the user's previous message (a follow-up such as "how long does it take?" is searched
/// with its subject) and put in the prompt as numbered sources. Without, the messages go
/// to the model as they are and the answer has no sources.
///
/// Returns the answer to free with `rag_answer_free`, or NULL with `*error` set.
///
/// # Safety
/// `messages` points to `n_messages` messages whose strings are NUL-terminated; the other
/// arguments as in `rag_ask`.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // a C signature
pub unsafe extern "C" fn rag_chat(
    assistant: *const RagAssistant,
    messages: *const RagChatMessage,
    n_messages: usize,
    retrieve: bool,
    opts: *const RagAskOptions,
    on_text: RagTextCallback,
    user_data: *mut c_void,
    cancel: *const i32,
    error: *mut *mut c_char,
) -> *mut RagAnswer {
    contain(error, std::ptr::null_mut(), || {
        let a = handle(assistant)?;
        let messages = self::messages(messages, n_messages)?;
        let mut stream = Stream::new(on_text, user_data, cancel);
        let answer = a.chat(&messages, retrieve, &ask_options(opts)?, &mut |p| {
            stream.push(p)
        })?;
        Ok(answer_to_c(answer))
    })
}
