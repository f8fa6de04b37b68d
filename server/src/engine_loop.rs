//! The engine driven from a thread of its own: requests arrive through a channel, tokens
//! stream back through one channel per request, an idle engine waits the batch window to
//! gather a batch, and a running one takes new requests at the next step. The engine's
//! figures go to the metrics recorder (if one is installed) as they change.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fornax_engine::kv::BlockValues;
use fornax_engine::sampling::TokenLogprobs;
use fornax_engine::sched::{FinishReason, RequestId, SubmitError};
use fornax_engine::{Engine, EngineBackend, Event, Request};
use tokio::sync::mpsc::UnboundedSender;

use crate::telemetry::record_engine;
use fornax_engine::kv::remote::{lookable_blocks, RemoteTier};

/// Where a request's updates go (readable from async code and, with `blocking_recv`,
/// from plain threads).
pub type Updates = UnboundedSender<Update>;

/// What a client asks of the engine loop.
pub enum Command {
    /// Queue a request; its updates go to `updates`.
    Submit { request: Request, updates: Updates },
    /// Cancel a request (its blocks return to the pool at once).
    Cancel(RequestId),
}

/// What the engine loop tells a request's client.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// Queued under this id.
    Accepted(RequestId),
    /// Refused at submission.
    Rejected(SubmitError),
    /// A new token, with its log-probabilities where asked for.
    Token(u32, Option<Box<TokenLogprobs>>),
    /// Log-probabilities of the prompt's next tokens (`prompt_logprobs`), before any token.
    PromptLogprobs(Vec<TokenLogprobs>),
    /// Done.
    Finished(FinishReason),
    /// The model failed; the request was dropped.
    Failed(String),
}

/// A request back from the shared tier: the blocks found from full block `first` on.
struct Looked {
    request: Request,
    updates: Updates,
    first: usize,
    blocks: Vec<BlockValues>,
}

/// Lookups in the shared tier: requests whose prompts this engine does not hold are asked
/// for there (on the tier's thread) before they are submitted; the engine never waits.
struct Lookups {
    tier: Arc<RemoteTier>,
    done: Sender<Looked>,
    found: Receiver<Looked>,
    pending: usize,
}

/// How often an idle engine with lookups in flight checks for them.
const LOOKUP_POLL: Duration = Duration::from_millis(2);

/// Runs `engine` until `commands` is closed and every request is done. A request whose
/// client has gone (its update channel closed) is cancelled at its next token.
pub fn run_engine<B: EngineBackend>(
    engine: &mut Engine<'_, B>,
    commands: &Receiver<Command>,
    window: Duration,
) {
    run_engine_with(engine, commands, window, None);
}

/// [`run_engine`] with a shared KV tier: prompts are looked up there when the engine
/// holds fewer of their blocks, and every full block the engine indexes is written there.
pub fn run_engine_with<B: EngineBackend>(
    engine: &mut Engine<'_, B>,
    commands: &Receiver<Command>,
    window: Duration,
    remote: Option<Arc<RemoteTier>>,
) {
    let mut lookups = remote.map(|tier| {
        let (done, found) = channel();
        engine.kv.pool.enable_publishing();
        Lookups {
            tier,
            done,
            found,
            pending: 0,
        }
    });
    let mut clients: HashMap<RequestId, Updates> = HashMap::new();
    let mut open = true;
    loop {
        record_engine(engine, false);
        if let Some(l) = lookups.as_mut() {
            while let Ok(looked) = l.found.try_recv() {
                l.pending -= 1;
                submit_looked(engine, &mut clients, looked);
            }
        }
        let waiting = lookups.as_ref().is_some_and(|l| l.pending > 0);
        if engine.is_idle() && waiting {
            // Wait for a command or a lookup, whichever comes first.
            let l = lookups.as_mut().expect("waiting on lookups");
            if open {
                match commands.recv_timeout(LOOKUP_POLL) {
                    Ok(c) => handle(engine, &mut clients, Some(l), c),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => open = false,
                }
            } else if let Ok(looked) = l.found.recv_timeout(LOOKUP_POLL) {
                l.pending -= 1;
                submit_looked(engine, &mut clients, looked);
            }
            continue;
        }
        if engine.is_idle() {
            if !open {
                return;
            }
            // Block for the first request, then gather for the window.
            let Ok(first) = commands.recv() else { return };
            handle(engine, &mut clients, lookups.as_mut(), first);
            let deadline = Instant::now() + window;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match commands.recv_timeout(left) {
                    Ok(c) => handle(engine, &mut clients, lookups.as_mut(), c),
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
        } else {
            loop {
                match commands.try_recv() {
                    Ok(c) => handle(engine, &mut clients, lookups.as_mut(), c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
        }
        if engine.is_idle() {
            continue;
        }
        let stepped = engine.step();
        record_engine(engine, true);
        if let Some(l) = &lookups {
            for (tokens, values) in engine.kv.take_published() {
                l.tier.publish(tokens, values);
            }
        }
        match stepped {
            Ok(events) => {
                for event in events {
                    match event {
                        Event::Token {
                            id,
                            token,
                            logprobs,
                        } => {
                            let gone = clients
                                .get(&id)
                                .is_none_or(|c| c.send(Update::Token(token, logprobs)).is_err());
                            if gone {
                                clients.remove(&id);
                                engine.cancel(id);
                            }
                        }
                        Event::PromptLogprobs { id, logprobs } => {
                            if let Some(c) = clients.get(&id) {
                                let _ = c.send(Update::PromptLogprobs(logprobs));
                            }
                        }
                        Event::Finished { id, reason } => {
                            if let Some(c) = clients.remove(&id) {
                                let _ = c.send(Update::Finished(reason));
                            }
                        }
                    }
                }
            }
            Err(e) => {
                for (id, c) in clients.drain() {
                    engine.cancel(id);
                    let _ = c.send(Update::Failed(e.to_string()));
                }
            }
        }
    }
}

fn handle<B: EngineBackend>(
    engine: &mut Engine<'_, B>,
    clients: &mut HashMap<RequestId, Updates>,
    lookups: Option<&mut Lookups>,
    command: Command,
) {
    match command {
        Command::Submit { request, updates } => {
            if let Some(l) = lookups {
                let held = engine.kv.pool.held_blocks(&request.prompt);
                if held < lookable_blocks(&request.prompt) {
                    // Not all here: ask the shared tier first, off this thread.
                    let done = l.done.clone();
                    let prompt = request.prompt.clone();
                    l.pending += 1;
                    l.tier.lookup_in_background(
                        prompt,
                        held,
                        Box::new(move |blocks| {
                            let looked = Looked {
                                request,
                                updates,
                                first: held,
                                blocks,
                            };
                            let _ = done.send(looked);
                        }),
                    );
                    return;
                }
            }
            submit(engine, clients, request, updates);
        }
        Command::Cancel(id) => {
            clients.remove(&id);
            engine.cancel(id);
        }
    }
}

/// Submits a request with what the shared tier found for it.
fn submit_looked<B: EngineBackend>(
    engine: &mut Engine<'_, B>,
    clients: &mut HashMap<RequestId, Updates>,
    looked: Looked,
) {
    engine.import_prefix(&looked.request.prompt, looked.first, looked.blocks);
    submit(engine, clients, looked.request, looked.updates);
}

fn submit<B: EngineBackend>(
    engine: &mut Engine<'_, B>,
    clients: &mut HashMap<RequestId, Updates>,
    request: Request,
    updates: Updates,
) {
    match engine.submit(request) {
        Ok(id) => {
            if updates.send(Update::Accepted(id)).is_ok() {
                clients.insert(id, updates);
            } else {
                engine.cancel(id);
            }
        }
        Err(e) => {
            let _ = updates.send(Update::Rejected(e));
        }
    }
}
