//! The engine driven from a thread of its own: requests arrive through a channel, tokens
//! stream back through one channel per request, an idle engine waits the batch window to
//! gather a batch, and a running one takes new requests at the next step. The engine's
//! figures go to the metrics recorder (if one is installed) as they change.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use fornax_engine::sched::{FinishReason, RequestId, SubmitError};
use fornax_engine::{Engine, EngineBackend, Event, Request};
use tokio::sync::mpsc::UnboundedSender;

use crate::server::telemetry::record_engine;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// Queued under this id.
    Accepted(RequestId),
    /// Refused at submission.
    Rejected(SubmitError),
    /// A new token.
    Token(u32),
    /// Done.
    Finished(FinishReason),
    /// The model failed; the request was dropped.
    Failed(String),
}

/// Runs `engine` until `commands` is closed and every request is done. A request whose
/// client has gone (its update channel closed) is cancelled at its next token.
pub fn run_engine<B: EngineBackend>(
    engine: &mut Engine<'_, B>,
    commands: &Receiver<Command>,
    window: Duration,
) {
    let mut clients: HashMap<RequestId, Updates> = HashMap::new();
    let mut open = true;
    loop {
        record_engine(engine, false);
        if engine.is_idle() {
            if !open {
                return;
            }
            // Block for the first request, then gather for the window.
            let Ok(first) = commands.recv() else { return };
            handle(engine, &mut clients, first);
            let deadline = Instant::now() + window;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match commands.recv_timeout(left) {
                    Ok(c) => handle(engine, &mut clients, c),
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
                    Ok(c) => handle(engine, &mut clients, c),
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
        match stepped {
            Ok(events) => {
                for event in events {
                    match event {
                        Event::Token { id, token } => {
                            let gone = clients
                                .get(&id)
                                .is_none_or(|c| c.send(Update::Token(token)).is_err());
                            if gone {
                                clients.remove(&id);
                                engine.cancel(id);
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
    command: Command,
) {
    match command {
        Command::Submit { request, updates } => match engine.submit(request) {
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
        },
        Command::Cancel(id) => {
            clients.remove(&id);
            engine.cancel(id);
        }
    }
}
