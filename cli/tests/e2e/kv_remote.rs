//! The shared KV tier on a real `redis-server` (started on a free loopback port) between
//! `fornax serve` replicas: a replica reuses the prefix blocks another one computed, with
//! the answers of a server without the tier; tampered values are never used; Redis going
//! away costs misses, never a request.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::{completion, Server};

/// A `redis-server` on a free loopback port, killed on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is needed (scripts/setup.sh installs Debian's redis-server)");
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Every key Fornax wrote.
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("fornax:kv:*")
            .query(&mut self.connection())
            .unwrap();
        keys.sort();
        keys
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A long shared system text (about 270 tokens, eight full blocks) and a question after it.
fn prompt(system: usize, question: &str) -> String {
    let topics = ["a bookshop", "a broadband provider", "a travel agency"];
    let text = format!(
        "You are the support assistant of {}. Answer politely, briefly and precisely. \
         Never ask for a full card number, confirm the reference before discussing a case, \
         and escalate complaints about damage to a human agent. ",
        topics[system % topics.len()]
    );
    format!("{}Customer: {question}\nAssistant:", text.repeat(6))
}

/// The greedy answer of `server` to `prompt`.
fn answer(server: &Server, prompt: &str) -> String {
    let (status, r) = server.post("/v1/completions", &completion(prompt, 12, false));
    assert_eq!(status, 200, "{r}");
    r["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Waits until `server` has written at least `blocks` blocks to the shared tier and
/// writes nothing more for half a second.
fn wait_written(server: &Server, blocks: f64) {
    let start = Instant::now();
    let written = || {
        server
            .metrics()
            .value("fornax_kv_remote_written_blocks_total", &[])
    };
    let mut last = (written(), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = written();
        if now != last.0 {
            last = (now, Instant::now());
        } else if now >= blocks && last.1.elapsed() > Duration::from_millis(500) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {now} blocks written"
        );
    }
}

#[test]
fn a_replica_reuses_the_prefix_blocks_another_replica_computed() {
    let redis = Redis::start();
    let url = redis.url();
    let a = Server::start(&["--kv-remote", &url]);
    let first = prompt(0, "Where is my parcel?");
    answer(&a, &first);
    wait_written(&a, 8.0);

    // Replica B has never seen the system text: its prefix comes from Redis.
    let b = Server::start(&["--kv-remote", &url]);
    let second = prompt(0, "Can I change my delivery address?");
    let from_b = answer(&b, &second);
    let plain = Server::start(&[]);
    assert_eq!(
        from_b,
        answer(&plain, &second),
        "B's answer is a single replica's"
    );
    let m = b.metrics();
    let hits = m.value("fornax_kv_remote_hit_blocks_total", &[]);
    let restored = m.value("fornax_kv_host_restored_blocks_total", &[]);
    eprintln!("replica B: {hits} blocks from Redis, {restored} restored");
    assert!(hits >= 6.0, "{hits} remote hits");
    assert!(restored >= 6.0, "{restored} blocks restored");
    assert!(m.value("fornax_prefix_hit_tokens_total", &[]) >= 6.0 * 32.0);
    assert_eq!(m.value("fornax_kv_remote_rejected_total", &[]), 0.0);
    assert_eq!(m.value("fornax_kv_remote_errors_total", &[]), 0.0);
    // A holds every block of its own prompt: it does not ask Redis for them.
    let lookups = a.metrics().value("fornax_kv_remote_lookups_total", &[]);
    answer(&a, &first);
    assert_eq!(
        a.metrics().value("fornax_kv_remote_lookups_total", &[]),
        lookups
    );
    b.assert_healthy();
}

#[test]
fn tampered_values_in_redis_are_never_used() {
    let redis = Redis::start();
    let url = redis.url();
    let a = Server::start(&["--kv-remote", &url]);
    let prompts: Vec<String> = (0..3).map(|s| prompt(s, "Where is my order?")).collect();
    // Each system text's blocks, as A wrote them.
    let mut keys_by_prompt = Vec::new();
    let mut expected = Vec::new();
    let mut seen = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        expected.push(answer(&a, p));
        wait_written(&a, 8.0 * (i + 1) as f64);
        let keys: Vec<String> = redis
            .keys()
            .into_iter()
            .filter(|k| !seen.contains(k))
            .collect();
        seen.extend(keys.iter().cloned());
        keys_by_prompt.push(keys);
    }
    let mut c = redis.connection();
    let get = |c: &mut redis::Connection, k: &str| -> Vec<u8> {
        redis::cmd("GET").arg(k).query(c).unwrap()
    };
    let set = |c: &mut redis::Connection, k: &str, v: &[u8]| {
        let _: () = redis::cmd("SET").arg(k).arg(v).query(c).unwrap();
    };
    // 1: other tokens under each key (another prompt's block).
    let foreign = get(&mut c, &keys_by_prompt[2][0]);
    for k in &keys_by_prompt[0] {
        set(&mut c, k, &foreign);
    }
    // 2: truncated values.
    for k in &keys_by_prompt[1] {
        let v = get(&mut c, k);
        set(&mut c, k, &v[..v.len() - 100]);
    }
    // 3: another model's fingerprint (bytes 8..40 of the value).
    for k in &keys_by_prompt[2] {
        let mut v = get(&mut c, k);
        v[20] ^= 0xff;
        set(&mut c, k, &v);
    }

    let b = Server::start(&["--kv-remote", &url]);
    for (p, want) in prompts.iter().zip(&expected) {
        assert_eq!(&answer(&b, p), want);
    }
    let m = b.metrics();
    assert_eq!(m.value("fornax_kv_remote_hit_blocks_total", &[]), 0.0);
    assert_eq!(m.value("fornax_kv_host_restored_blocks_total", &[]), 0.0);
    assert_eq!(m.value("fornax_kv_remote_rejected_total", &[]), 3.0);
    b.assert_healthy();
}

#[test]
fn redis_going_away_costs_misses_and_no_request() {
    let mut redis = Redis::start();
    let url = redis.url();
    let a = Server::start(&["--kv-remote", &url, "--kv-remote-timeout-ms", "200"]);
    let prompts: Vec<String> = (0..6)
        .map(|i| {
            prompt(
                i,
                &format!("Question number {i}: what are your opening hours?"),
            )
        })
        .collect();
    let answers: Vec<String> = std::thread::scope(|s| {
        let a = &a;
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || answer(a, p)))
            .collect();
        // Redis goes away with requests in flight.
        std::thread::sleep(Duration::from_millis(150));
        redis.kill();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every request completed, with the answers of a server without the tier.
    let plain = Server::start(&[]);
    for (p, got) in prompts.iter().zip(&answers) {
        assert_eq!(got, &answer(&plain, p));
    }
    // More requests after Redis is gone: misses, counted as errors, still answered.
    for p in &prompts[..2] {
        let other = p.replace("opening hours", "prices");
        assert_eq!(answer(&a, &other), answer(&plain, &other));
    }
    let m = a.metrics();
    let errors = m.value("fornax_kv_remote_errors_total", &[]);
    eprintln!("errors counted: {errors}");
    assert!(errors > 0.0);
    a.assert_healthy();
}
