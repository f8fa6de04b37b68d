//! The customer-service workload of `bench table`: multi-turn chats over a few shared
//! system prompts, in the model's chat template, with mixed QoS classes and Poisson
//! arrivals. Seeded, so every engine and every run sees the same requests.

use anyhow::Result;
use fornax_engine::tokenizer::{ChatMessage, Tokenizer};
use rand::{rngs::StdRng, seq::IndexedRandom, Rng, SeedableRng};
use serde::Serialize;

use crate::load::{poisson_gap, Job};

/// System prompts of three support desks; conversations share them.
const SYSTEM_PROMPTS: [&str; 3] = [
    "You are the customer support assistant of Northwind Books, an online bookshop that \
     ships to twenty countries. Answer politely and briefly. Orders ship within two working \
     days; standard delivery takes three to five days and express delivery one to two. \
     Customers may return unread books within thirty days for a full refund; e-books cannot \
     be returned once downloaded. Never ask for a full card number. If a parcel is lost, \
     offer a replacement or a refund after seven days without tracking updates. Escalate \
     complaints about damaged items to a human agent with the order number.",
    "You are the help desk assistant of Lumen Broadband, a fibre internet provider. Be \
     friendly and precise. Plans are 300 Mbit/s, 1 Gbit/s and 2 Gbit/s, billed monthly with \
     no fixed term. Outages are listed on the status page; if the customer's area shows no \
     outage, walk them through restarting the router, checking the fibre cable and the \
     status lights. A technician visit is free when the fault is on the network side. \
     Customers can move their plan to a new address with fourteen days' notice. Do not \
     promise compensation; explain that credits are decided by the billing team.",
    "You are the virtual agent of Atlas Travel, which sells flights, hotels and package \
     holidays. Keep answers short and clear. Bookings can be changed up to forty-eight \
     hours before departure for a fee that depends on the fare; flexible fares change for \
     free. Refunds go back to the original payment method within ten working days. Travel \
     insurance covers cancellation for illness with a doctor's note. For visa questions, \
     point customers to the destination's official embassy site. Always confirm the \
     booking reference before discussing a booking's details.",
];

/// Questions customers ask, one per turn.
const QUESTIONS: [&str; 12] = [
    "Hi, I placed an order last week and it still has not arrived. What can I do?",
    "Can I change the delivery address on my order? I am moving on Friday.",
    "My connection drops every evening around eight. Is there an outage near me?",
    "How do I get a refund? The item I received is not what I ordered.",
    "What is the difference between your standard and express options?",
    "I was charged twice this month. Can you check my last payment?",
    "Is it possible to upgrade my plan without a new contract?",
    "I need to cancel because I am ill. Will my insurance cover it?",
    "Thanks. And how long will that take, roughly?",
    "Could you explain that again in simpler words, please?",
    "Okay, what information do you need from me to start?",
    "One more thing: can I speak to a human agent about this?",
];

/// Earlier replies of the assistant, fixed so that every engine sees the same history.
const REPLIES: [&str; 8] = [
    "I am sorry to hear that. Could you give me your order number so I can check its status?",
    "Of course. I can help with that. Please confirm your reference and I will look it up.",
    "Thank you for waiting. I have checked and there is no problem on our side at the moment.",
    "That should be possible. The change usually takes effect within two working days.",
    "Certainly. You will receive a confirmation by email once the request is processed.",
    "I understand. Let me explain the options you have, and you can choose what suits you.",
    "Refunds are sent to the original payment method and take up to ten working days.",
    "I have noted this on your account so the team can follow up with you directly.",
];

/// One request of the workload before arrival times are drawn.
#[derive(Debug, Clone)]
pub struct ChatTurn {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub qos: u8,
}

/// Shape of the workload.
#[derive(Debug, Clone)]
pub struct WorkloadShape {
    pub conversations: usize,
    pub turns: usize,
    /// Output length range in tokens (inclusive).
    pub output_tokens: [usize; 2],
    pub seed: u64,
}

/// QoS classes of the conversations: half interactive (0), a quarter standard (1), a
/// quarter batch (3, e.g. ticket summaries).
const QOS_MIX: [u8; 4] = [0, 0, 1, 3];

/// The workload's requests in arrival order: each conversation's turns in order, the
/// conversations interleaved at random. A turn's prompt is the system prompt, the earlier
/// questions and replies and the new question, rendered by the model's chat template.
pub fn chat_turns(tok: &Tokenizer, shape: &WorkloadShape) -> Result<Vec<ChatTurn>> {
    let mut rng = StdRng::seed_from_u64(shape.seed);
    let mut histories: Vec<Vec<ChatMessage>> = (0..shape.conversations)
        .map(|c| {
            let system = SYSTEM_PROMPTS[c % SYSTEM_PROMPTS.len()];
            vec![ChatMessage::new("system", system)]
        })
        .collect();
    let qos: Vec<u8> = (0..shape.conversations)
        .map(|_| *QOS_MIX.choose(&mut rng).expect("non-empty"))
        .collect();
    let mut next_turn = vec![0usize; shape.conversations];
    let mut turns = Vec::with_capacity(shape.conversations * shape.turns);
    loop {
        let open: Vec<usize> = (0..shape.conversations)
            .filter(|&c| next_turn[c] < shape.turns)
            .collect();
        let Some(&c) = open.choose(&mut rng) else {
            break;
        };
        let history = &mut histories[c];
        if next_turn[c] > 0 {
            history.push(ChatMessage::new(
                "assistant",
                REPLIES.choose(&mut rng).expect("non-empty"),
            ));
        }
        history.push(ChatMessage::new(
            "user",
            QUESTIONS.choose(&mut rng).expect("non-empty"),
        ));
        let [lo, hi] = shape.output_tokens;
        turns.push(ChatTurn {
            prompt: tok.encode_chat(history)?,
            max_tokens: rng.random_range(lo..=hi),
            qos: qos[c],
        });
        next_turn[c] += 1;
    }
    Ok(turns)
}

/// `turns` arriving as a Poisson process of `rate` requests per second (seeded).
pub fn with_arrivals(turns: &[ChatTurn], rate: f64, seed: u64) -> Vec<Job> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED_A441);
    let mut t = 0.0;
    turns
        .iter()
        .map(|turn| {
            let job = Job {
                arrival: t,
                prompt: turn.prompt.clone(),
                max_tokens: turn.max_tokens,
                qos: turn.qos,
            };
            t += poisson_gap(&mut rng, rate);
            job
        })
        .collect()
}

/// The workload as the peer's driver reads it (`scripts/peer/llama-replay.mjs`).
#[derive(Debug, Serialize)]
pub struct PeerWorkload<'a> {
    /// Sequences served at once (Fornax's maximum batch).
    pub parallel: usize,
    /// Seconds after its arrival at which a request is given up.
    pub timeout_s: f64,
    /// Tokens per forward pass at most.
    pub batch_tokens: usize,
    pub requests: Vec<PeerRequest<'a>>,
}

/// One request for the peer.
#[derive(Debug, Serialize)]
pub struct PeerRequest<'a> {
    pub arrival: f64,
    pub prompt: &'a [u32],
    pub max_tokens: usize,
}

impl<'a> PeerWorkload<'a> {
    /// `jobs` for the peer.
    pub fn new(jobs: &'a [Job], parallel: usize, timeout_s: f64, batch_tokens: usize) -> Self {
        Self {
            parallel,
            timeout_s,
            batch_tokens,
            requests: jobs
                .iter()
                .map(|j| PeerRequest {
                    arrival: j.arrival,
                    prompt: &j.prompt,
                    max_tokens: j.max_tokens,
                })
                .collect(),
        }
    }
}
