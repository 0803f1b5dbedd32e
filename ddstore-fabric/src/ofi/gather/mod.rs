//! The gather path: reads served by the owner, over two-sided tagged messages.
//!
//! Over providers without hardware RMA (tcp;ofi_rxm, sockets) every
//! one-sided read is a request/response pair in software. Instead a reader
//! sends each owner one tagged *request* per batch: the share's memory key,
//! the byte ranges it wants and how they are grouped into reply messages;
//! the owner's progress thread checks the key and every range against the
//! share it exposes and answers with one tagged message per group, the
//! ranges packed back to back. The reader posts a receive per message before
//! sending the request: straight into the destination when the group lands
//! contiguously there, else into a reader-owned bounce buffer it scatters from.
//!
//! Authentication. Anyone who can reach an endpoint can send it tagged
//! messages, so both directions are bound to a secret:
//! - every request ends with a MAC (BLAKE3 in keyed mode) under the job's
//!   [`MacKey`]; an owner verifies it, in constant time, before it reads
//!   anything else of the request, in particular the reply address;
//! - every request carries a fresh 128-bit [`Nonce`] from the operating
//!   system's CSPRNG. Its reply tags hold 52 of its bits (a reply with any
//!   other tag matches no receive the reader posted) and every reply message
//!   carries [`REPLY_DATA_BYTES`] more of them as its remote CQ data, which
//!   the reader checks before it uses the message (in the completion, so a
//!   reply lands in one buffer: a header of its own cost large replies an
//!   extra piece in rxm's rendezvous). Readers also receive only from the
//!   owner's address where the provider offers directed receives.
//!
//! Tags: requests carry [`REQUEST_TAG`]; a reply's tag is the nonce's tag
//! bits, a status (0 = data, else a [`Refusal`] and no payload) and the
//! message's index in the request.
//!
//! Files, in import order: [`wire`] (tags, nonces, MACs, request encoding),
//! [`plan`] (how a reader cuts a batch into requests and reply messages),
//! [`answer`] (what an owner serves, and its answers to a request),
//! [`client`] (the reader's exchange), [`server`] (the owner's
//! progress-thread loop).

pub(crate) mod answer;
pub(crate) mod client;
pub(crate) mod plan;
pub(crate) mod replies;
pub(crate) mod server;
pub(crate) mod spill_reads;
pub(crate) mod wire;
