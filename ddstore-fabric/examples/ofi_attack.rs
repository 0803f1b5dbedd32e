//! An attacker on the gather path, for the tests (`tests/test_attacks.py`):
//! a raw libfabric tcp;ofi_rxm endpoint that sends what a party on the
//! network could, to endpoints given as loopback TCP ports. It knows no
//! job secret unless one is given (`--token`, a token holder's attacks).
//!
//! `ofi_attack MODE SECONDS PORT...` prints one line `sent N ok M` (messages
//! the provider took; for `guess-keys`, reads that returned data). Modes:
//! - `forge-replies`: tagged messages over a range of tags (every status
//!   and message index with nonce bits 0, then random tags), payload 0xEE;
//! - `requests`: requests without a MAC and under a wrong key, with reply
//!   addresses of every family and of lengths 0..64 (one each), then as many
//!   as fit in the time pointing at ports 1 (closed) and `--listener PORT`;
//! - `guess-keys`: one-sided reads of 64 bytes at offset 0 with random keys;
//! - `big-request` (with `--token`, `--key K`, `--len L`): a request claiming
//!   2^32-1 ranges and messages, then one of 900 ranges of the whole share
//!   with key K (L bytes) in one message and one in 900 messages (longer
//!   than any request); prints `refused N statuses [..]` (refusals received) first;
//! - `stall` (same flags): 400 requests of the whole share in 16 messages
//!   each, whose replies this process never receives;
//! - `backlog` (same flags, `--listeners P,P,..`): every second, 5 requests
//!   of the whole share in 256 messages each per listener, whose replies go
//!   to that listener (one that never accepts);
//! - `ragged` (`--token`, `--ragged VALUES_KEY,ENDS_KEY,UNIT,ROWS`,
//!   `--listeners`): every second, 4 ragged requests of every row per
//!   listener, replies to the listeners;
//! - `replay` (`--token`, `--key`, `--len`, `--listeners`: the reader's
//!   ports): one request of about 8 MiB of the share per reader port, each
//!   sent 20 times, the same bytes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ddstore_fabric::ofi::wire::{self, MacKey, Nonce};
use ddstore_fabric::ofi::{Av, Cq, Domain, Endpoint, Fabric, Info, InfoRequest, Poll};
use libfabric_sys as sys;
use rand::Rng;

fn sockaddr(port: u16) -> Vec<u8> {
    let mut a = vec![0u8; 16];
    a[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    a[2..4].copy_from_slice(&port.to_be_bytes());
    a[4..8].copy_from_slice(&[127, 0, 0, 1]);
    a
}

struct Attacker {
    ep: Arc<Endpoint>,
    targets: Vec<sys::fi_addr_t>,
    ctx: Box<[sys::fi_context2; 64]>,
    sent: u64,
    ok: u64,
    /// Receives that brought a refusal (a reply tag with status bits).
    refused: u64,
    /// Their statuses (see `Refusal` in gather/wire.rs).
    statuses: Vec<u64>,
}

impl Attacker {
    fn open(ports: &[u16]) -> Attacker {
        let req = InfoRequest {
            provider: Some("tcp;ofi_rxm".into()),
            node: Some("127.0.0.1".into()),
            tagged: true,
            ..Default::default()
        };
        let info = Info::query(&req).expect("tcp;ofi_rxm");
        let fabric = Arc::new(Fabric::open(&info).expect("fabric"));
        let domain = Domain::open(&fabric).expect("domain");
        let cq =
            Arc::new(Cq::open_format(&domain, 256, false, sys::FI_CQ_FORMAT_TAGGED).expect("cq"));
        let av = Arc::new(Av::open(&domain, ports.len() + 8).expect("av"));
        let ep = Arc::new(Endpoint::open(&domain, cq, av).expect("endpoint"));
        let len = ep.name().expect("name").len();
        let names: Vec<Vec<u8>> = ports.iter().map(|&p| sockaddr(p)).collect();
        let refs: Vec<&[u8]> = names.iter().map(|n| n.as_slice()).collect();
        let targets = ep.av().insert(&refs, len).expect("insert");
        Attacker {
            ep,
            targets,
            ctx: Box::new([sys::fi_context2::default(); 64]),
            sent: 0,
            ok: 0,
            refused: 0,
            statuses: Vec::new(),
        }
    }

    /// Polls the CQ once; counts completed operations that succeeded.
    fn poll(&mut self) {
        let mut e = [sys::fi_cq_tagged_entry::default(); 64];
        if let Ok(Poll::Completed(n)) = self.ep.cq().poll(&mut e) {
            self.ok += n as u64;
            for e in &e[..n] {
                if e.flags & sys::FI_RECV as u64 != 0 && e.tag & wire::STATUS_MASK != 0 {
                    self.refused += 1;
                    self.statuses.push((e.tag & wire::STATUS_MASK) >> 9);
                }
            }
        }
    }

    /// Sends `bytes` with `tag` to target `t` (progressing while the provider is busy).
    fn send(&mut self, t: usize, tag: u64, bytes: &[u8], deadline: Instant) {
        let iov = [sys::iovec {
            iov_base: bytes.as_ptr() as *mut _,
            iov_len: bytes.len(),
        }];
        let ctx = &mut self.ctx[(self.sent % 64) as usize] as *mut _ as *mut _;
        while Instant::now() < deadline {
            // SAFETY: `bytes` outlives the send: the caller keeps it until
            // the process exits (the attacker never frees what it sent).
            let rc = unsafe { self.ep.post_tsendv(&iov, self.targets[t], tag, ctx) };
            self.poll();
            match rc {
                Ok(Ok(())) => {
                    self.sent += 1;
                    return;
                }
                Ok(Err(_)) => std::thread::sleep(Duration::from_micros(50)),
                Err(_) => return,
            }
        }
    }
}

fn leak(v: Vec<u8>) -> &'static [u8] {
    Box::leak(v.into_boxed_slice())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let mode = args[1].clone();
    let seconds: f64 = args[2].parse().expect("seconds");
    let ports: Vec<u16> = args[3..]
        .iter()
        .take_while(|a| !a.starts_with("--"))
        .map(|p| p.parse().expect("port"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut a = Attacker::open(&ports);
    let targets = ports.len();
    match mode.as_str() {
        "forge-replies" => forge_replies(&mut a, targets, deadline),
        "requests" => {
            let listener: u16 = flag("--listener").map_or(1, |p| p.parse().unwrap());
            unauthenticated_requests(&mut a, targets, listener, deadline)
        }
        "guess-keys" => guess_keys(&mut a, targets, deadline),
        "big-request" | "stall" => {
            let token = flag("--token").expect("--token");
            let key: u64 = flag("--key").map_or(0, |k| k.parse().unwrap());
            // The share's length: every range lies inside it.
            let len: u64 = flag("--len").map_or(64 << 20, |k| k.parse().unwrap());
            let big = mode == "big-request";
            token_holder(&mut a, targets, &token, (key, len), big, deadline)
        }
        "backlog" | "ragged" | "replay" => {
            let token = flag("--token").expect("--token");
            let listeners: Vec<u16> = flag("--listeners")
                .expect("--listeners")
                .split(',')
                .map(|p| p.parse().expect("port"))
                .collect();
            let key: u64 = flag("--key").map_or(0, |k| k.parse().unwrap());
            let len: u64 = flag("--len").map_or(64 << 20, |k| k.parse().unwrap());
            let ragged: Vec<u64> = flag("--ragged")
                .map(|r| r.split(',').map(|v| v.parse().unwrap()).collect())
                .unwrap_or_default();
            misdirected(
                &mut a,
                targets,
                &mode,
                &token,
                (key, len),
                &ragged,
                &listeners,
                deadline,
            )
        }
        other => panic!("unknown mode {other}"),
    }
    println!("sent {} ok {}", a.sent, a.ok);
}

/// `forge-replies`: messages with every reply tag of the all-zero nonce, then random tags.
fn forge_replies(a: &mut Attacker, targets: usize, deadline: Instant) {
    let mut rng = rand::thread_rng();
    let payload = leak(vec![0xEE; 3072]);
    let zero = Nonce([0; 16]);
    let mut tags: Vec<u64> = Vec::new();
    for status in 0..8 {
        for index in 0..64 {
            tags.push(wire::reply_tag(&zero, index, status));
        }
    }
    'outer: loop {
        for t in 0..targets {
            let tag = match tags.pop() {
                Some(t) => t,
                None => rng.gen(),
            };
            a.send(t, tag, payload, deadline);
            if Instant::now() >= deadline {
                break 'outer;
            }
        }
    }
}

/// `requests`: requests under a wrong key (and without a MAC), with reply
/// names of every length and family, then many naming `listener`.
fn unauthenticated_requests(a: &mut Attacker, targets: usize, listener: u16, deadline: Instant) {
    let mut rng = rand::thread_rng();
    let wrong = MacKey::derive(b"a guess at the job token");
    let mut one_each: Vec<&'static [u8]> = Vec::new();
    one_each.push(leak(vec![0u8; 62])); // no MAC, family 0
    for len in 0..=64usize {
        for family in [0u16, 1, 2, 10, 17, 0xffff] {
            let mut name = vec![0u8; len];
            if len >= 2 {
                name[..2].copy_from_slice(&family.to_ne_bytes());
            }
            if len >= 4 {
                name[2..4].copy_from_slice(&1u16.to_be_bytes());
            }
            let mut out = Vec::new();
            let req = wire::Request {
                key: rng.gen(),
                msg_ranges: vec![1],
                ranges: vec![(0, 64)],
            };
            wire::encode(&mut out, &wrong, &Nonce(rng.gen()), &name, &req);
            one_each.push(leak(out.clone()));
            // The same without its MAC.
            out.truncate(out.len() - wire::MAC_BYTES);
            one_each.push(leak(out));
        }
    }
    for (i, bytes) in one_each.iter().enumerate() {
        a.send(i % targets, wire::REQUEST_TAG, bytes, deadline);
    }
    let mut many: Vec<&'static [u8]> = Vec::new();
    for port in [1u16, listener] {
        let mut out = Vec::new();
        let req = wire::Request {
            key: rng.gen(),
            msg_ranges: vec![1],
            ranges: vec![(0, 4096)],
        };
        wire::encode(&mut out, &wrong, &Nonce(rng.gen()), &sockaddr(port), &req);
        many.push(leak(out));
    }
    let mut i = 0;
    while Instant::now() < deadline && a.sent < 50_000 {
        a.send(i % targets, wire::REQUEST_TAG, many[i % 2], deadline);
        i += 1;
    }
}

/// `guess-keys`: one-sided reads with random memory keys, one at a time.
fn guess_keys(a: &mut Attacker, targets: usize, deadline: Instant) {
    let mut rng = rand::thread_rng();
    let buf = leak(vec![0u8; 64]).as_ptr() as *mut u8;
    while Instant::now() < deadline {
        for t in 0..targets {
            let key: u64 = rng.gen();
            let ctx = &mut a.ctx[0] as *mut _ as *mut _;
            // SAFETY: buf is leaked (never freed); one read in flight at a time.
            let rc = unsafe {
                a.ep.post_read(buf, 64, std::ptr::null_mut(), a.targets[t], 0, key, ctx)
            };
            if matches!(rc, Ok(Ok(()))) {
                a.sent += 1;
                // Wait for this read to finish (data, or an error).
                let start = Instant::now();
                let before = a.ok;
                loop {
                    let mut e = [sys::fi_cq_tagged_entry::default(); 4];
                    match a.ep.cq().poll(&mut e) {
                        Ok(Poll::Completed(0)) => {}
                        Ok(Poll::Completed(n)) => {
                            a.ok += n as u64;
                            break;
                        }
                        _ => break,
                    }
                    if start.elapsed() > Duration::from_secs(1) {
                        break;
                    }
                }
                let _ = before;
            } else {
                a.poll();
            }
        }
    }
}

/// `big-request` (`big`) and `stall`: a token holder's oversized requests
/// for `share` (key, length), refusals counted, or requests whose replies
/// it never receives.
fn token_holder(
    a: &mut Attacker,
    targets: usize,
    token: &str,
    share: (u64, u64),
    big: bool,
    deadline: Instant,
) {
    let (key, len) = share;
    let mut rng = rand::thread_rng();
    let mac = MacKey::derive(token.as_bytes());
    // Replies go to this endpoint: `stall` never receives them,
    // `big-request` counts the refusals it gets.
    let me = a.ep.name().unwrap();
    let inbox = leak(vec![0u8; 64 * 8]).as_ptr() as *mut u8;
    if big {
        for i in 0..8 {
            // SAFETY: the inbox is leaked; context slots 56.. are only used here.
            let _ = unsafe {
                a.ep.post_trecv(
                    inbox.add(64 * i),
                    64,
                    0,
                    u64::MAX,
                    &mut a.ctx[56 + i] as *mut _ as *mut _,
                )
            };
        }
    }
    let mut reqs: Vec<wire::Request> = Vec::new();
    if big {
        reqs.push(wire::Request {
            key,
            msg_ranges: vec![900],
            ranges: vec![(0, len); 900],
        });
        reqs.push(wire::Request {
            key,
            msg_ranges: (0..900).map(|_| 1).collect(),
            ranges: vec![(0, len); 900],
        });
    } else {
        for _ in 0..400 {
            reqs.push(wire::Request {
                key,
                msg_ranges: vec![1; 16],
                ranges: (0..16).map(|i| (i * (len / 16), len / 16)).collect(),
            });
        }
    }
    if big {
        // Counts claiming far more than the bytes hold, MACed as a token holder can.
        let mut out = Vec::new();
        let r = wire::Request {
            key,
            msg_ranges: vec![1],
            ranges: vec![(0, 8)],
        };
        wire::encode(&mut out, &mac, &Nonce(rng.gen()), &me, &r);
        out.truncate(out.len() - wire::MAC_BYTES);
        // n_msgs and n_ranges follow magic, nonce, id, name length, name and key.
        let at = 4 + 16 + 8 + 2 + me.len() + 8;
        out[at..at + 8].copy_from_slice(&[0xff; 8]);
        let sealed = leak(mac.seal(out));
        for t in 0..targets {
            a.send(t, wire::REQUEST_TAG, sealed, deadline);
        }
    }
    // Stay alive without receiving anything until the deadline.
    // To every port given (the owner's endpoint is one of them).
    for r in &reqs {
        for t in 0..targets {
            let mut out = Vec::new();
            wire::encode(&mut out, &mac, &Nonce(rng.gen()), &me, r);
            a.send(t, wire::REQUEST_TAG, leak(out), deadline);
        }
    }
    while Instant::now() < deadline {
        if big {
            a.poll();
            if a.refused >= 2 {
                break; // both refusals are in (a loaded machine may take long)
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("refused {} statuses {:?}", a.refused, a.statuses);
}

/// `backlog`, `ragged` and `replay`: a token holder's requests whose
/// replies go to `listeners` (addresses that never accept, or a reader's).
#[allow(clippy::too_many_arguments)]
fn misdirected(
    a: &mut Attacker,
    targets: usize,
    mode: &str,
    token: &str,
    share: (u64, u64),
    ragged: &[u64],
    listeners: &[u16],
    deadline: Instant,
) {
    let (key, len) = share;
    let mut rng = rand::thread_rng();
    let mac = MacKey::derive(token.as_bytes());
    let encode = |rng: &mut rand::rngs::ThreadRng, port: u16| {
        let mut out = Vec::new();
        let nonce = Nonce(rng.gen());
        match mode {
            "backlog" => {
                let piece = (len / 256).max(1);
                let req = wire::Request {
                    key,
                    msg_ranges: vec![1; 256],
                    ranges: (0..256).map(|i| ((i * piece) % len, piece)).collect(),
                };
                wire::encode(&mut out, &mac, &nonce, &sockaddr(port), &req);
            }
            "ragged" => {
                let (values, ends, unit, rows) = (ragged[0], ragged[1], ragged[2], ragged[3]);
                let req = wire::RaggedRequest {
                    key: values,
                    n_msgs: 64,
                    part: wire::RaggedPart {
                        ends_key: ends,
                        unit_bytes: unit as u32,
                        msg_bytes: 4 << 20,
                        rows: (0..rows).collect(),
                    },
                };
                wire::encode_ragged(&mut out, &mac, &nonce, &sockaddr(port), &req);
            }
            _ => {
                // About 8 MiB: the share again and again, one message each.
                let n = ((8u64 << 20) / len).clamp(1, 256) as usize;
                let req = wire::Request {
                    key,
                    msg_ranges: vec![1; n],
                    ranges: vec![(0, len); n],
                };
                wire::encode(&mut out, &mac, &nonce, &sockaddr(port), &req);
            }
        }
        leak(out)
    };
    if mode == "replay" {
        let sealed: Vec<&'static [u8]> = listeners.iter().map(|&p| encode(&mut rng, p)).collect();
        for _ in 0..20 {
            for bytes in &sealed {
                for t in 0..targets {
                    a.send(t, wire::REQUEST_TAG, bytes, deadline);
                }
            }
        }
        println!("request bytes {}", sealed[0].len());
    } else {
        let per_listener = if mode == "backlog" { 5 } else { 4 };
        while Instant::now() < deadline {
            let round = Instant::now();
            for _ in 0..per_listener {
                for &port in listeners {
                    let bytes = encode(&mut rng, port);
                    for t in 0..targets {
                        a.send(t, wire::REQUEST_TAG, bytes, deadline);
                    }
                }
            }
            let rest = Duration::from_secs(1).saturating_sub(round.elapsed());
            std::thread::sleep(rest.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
    while Instant::now() < deadline {
        a.poll();
        std::thread::sleep(Duration::from_millis(5));
    }
}
