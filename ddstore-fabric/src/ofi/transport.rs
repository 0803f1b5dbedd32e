//! `OfiTransport`: methods 1 and 2 over libfabric one-sided reads.

use std::sync::{Arc, Mutex};

use ddstore_core::comm::Comm;
use ddstore_core::config::{Config, RemoteGather};
use ddstore_core::external::ExternalShare;
use ddstore_core::memory::Memory;
use ddstore_core::region::{share_on_node_located, Region};
use ddstore_core::transport::{
    ExposeOptions, Exposed, Prepared, RemoteShares, ShareReader, Transport, WrapShare,
};
use libfabric_sys as sys;

use super::av::Av;
use super::cq::Cq;
use super::domain::Domain;
use super::dst::DstRegistry;
use super::endpoint::Endpoint;
use super::fabric::Fabric;
use super::gather::answer::{Access, ServedShares};
use super::gather::server;
use super::gather::wire::MacKey;
use super::info::Info;
use super::mr::MemoryRegion;
use super::pool::EndpointPool;
use super::progress::Progress;
use super::reader::{OfiReader, ReaderSettings};
use super::record::{Peers, ShareRecord};
use super::select;
use super::select::InfoRequest;
use crate::error::{close_last, FabricError, FabricResult};

// Shares in device memory (FI_HMEM); a child module, for this file's private items.
#[path = "hmem.rs"]
mod hmem;

/// Opens fabric and domain from the first entry of `info`.
fn open_domain(info: &Info) -> FabricResult<Arc<Domain>> {
    let fabric = Arc::new(Fabric::open(info)?);
    Domain::open(&fabric)
}

/// This process's libfabric presence: a domain, the endpoint peers read our
/// shares through, and (manual progress) the thread that keeps it moving.
struct Node {
    // Field order is close order: stop the thread, then endpoint, then domain.
    _progress: Option<Progress>,
    target: Arc<Endpoint>,
    /// Shares this process answers gather requests for (gather path only).
    served: Option<Arc<ServedShares>>,
    /// Reader endpoints, shared by every variable's readers (in a domain of
    /// their own where progress is manual).
    readers: Arc<EndpointPool>,
    domain: Arc<Domain>,
}

impl Node {
    /// `gather`: the progress thread also answers gather requests (the
    /// domain must then offer tagged messages); replies wait for the
    /// provider at most `timeout` (the readers' `DDSTORE_TIMEOUT_S`);
    /// `max_readers` are served at once (`DDSTORE_GATHER_READERS`).
    /// `max_connections`: `DDSTORE_MAX_CONNECTIONS` (see `pool.rs`).
    fn open(
        info: &Info,
        gather: bool,
        timeout: std::time::Duration,
        max_readers: usize,
        access: &Arc<Access>,
        max_connections: usize,
    ) -> FabricResult<Node> {
        let domain = open_domain(info)?;
        // sockets reports auto progress, but its own progress thread is slow
        // to serve reads (measured: half the bandwidth without ours).
        let manual = domain.info().manual_data_progress() || domain.info().provider() == "sockets";
        // A wait object lets the progress thread sleep until a request arrives.
        let cq = if gather {
            Cq::open_blocking_if_possible_format(
                &domain,
                server::CQ_SIZE,
                sys::FI_CQ_FORMAT_TAGGED,
            )?
        } else if manual {
            Cq::open_blocking_if_possible(&domain, 64)?
        } else {
            Cq::open(&domain, 64, false)?
        };
        let av = Arc::new(Av::open(&domain, 1)?);
        let target = Arc::new(Endpoint::open(&domain, Arc::new(cq), av)?);
        let served = gather.then(|| Arc::new(ServedShares::default()));
        let progress = match &served {
            Some(shares) => {
                let server = server::Server::new(
                    target.clone(),
                    shares.clone(),
                    access.clone(),
                    timeout,
                    max_readers,
                )?;
                Some(Progress::start(target.clone(), Some(server))?)
            }
            None if manual => Some(Progress::start(target.clone(), None)?),
            None => None,
        };
        // Reader endpoints get a domain of their own where progress is manual:
        // libfabric 2.x's tcp progresses all of a domain's sockets under one
        // lock, so readers and the progress thread in one domain took turns
        // (2.3.1: about twice the CPU per gather batch; 1.17: no change).
        let readers = if manual {
            Domain::open(domain.fabric())?
        } else {
            domain.clone()
        };
        Ok(Node {
            _progress: progress,
            target,
            served,
            readers: EndpointPool::new(readers, max_connections),
            domain,
        })
    }
}

impl Node {
    /// Closes it in order: the progress thread stops, then the target
    /// endpoint, the idle reader endpoints (and their domain), the domain and its fabric;
    /// every close is attempted, the first failure reported.
    fn close(self) -> FabricResult<()> {
        let Node {
            _progress: progress,
            target,
            served,
            readers,
            domain,
        } = self;
        drop(progress);
        drop(served);
        let target = close_last(target, Endpoint::close);
        let readers = close_last(readers, |pool| pool.close());
        target.and(readers).and(close_last(domain, Domain::close))
    }
}

/// Takes the node out of `slot` and closes it if this was its last holder.
fn close_node(slot: &Mutex<Option<Arc<Node>>>) -> FabricResult<()> {
    let node = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
    node.map_or(Ok(()), |node| close_last(node, Node::close))
}

/// Providers `DDSTORE_REMOTE_GATHER=auto` reads through the gather path,
/// by measurement (`python -m pyddstore.bench`, same run): tcp;ofi_rxm, whose
/// one-sided reads are request/response pairs in software (128 x 3 KB rows:
/// 14.7 -> 2.0 µs/row). Not sockets: its own progress thread makes every
/// exchange slow either way, and single rows are 3.8x slower gathered
/// (`DDSTORE_REMOTE_GATHER=1` still gathers there).
pub fn gather_by_default(provider: &str) -> bool {
    provider.starts_with("tcp")
}

/// One-sided reads through libfabric (methods 1 and 2).
pub struct OfiTransport {
    config: Config,
    provider: String,
    request: InfoRequest,
    info: Info,
    node: Mutex<Option<Arc<Node>>>,
    /// Remote batches go through the owner-side gather path.
    gather: bool,
    /// The node of a domain opened with FI_HMEM, for device shares (opened on first use).
    hmem_node: Mutex<Option<Arc<Node>>>,
    /// Reader endpoints of a forked child, in a domain of its own (opened on
    /// first use), shared by every variable's readers.
    child_readers: Arc<Mutex<Option<Arc<EndpointPool>>>>,
    /// The job's request key (shared with the serving thread).
    access: Arc<Access>,
    /// The secret `access`'s key derives from (for spawned workers' handles).
    secret: Mutex<Option<Vec<u8>>>,
    /// The ranks' addresses as the last variable found them: every variable
    /// of a store shares this one table (see [`Peers::from_records`]).
    addrs: Mutex<Option<Arc<Vec<Vec<u8>>>>>,
}

impl OfiTransport {
    /// Picks the provider from `DDSTORE_FABRIC` (cxi, verbs, efa, opx, psm3, ucx,
    /// hsn/tcp, shm, sockets or any provider name; unset: cxi, else efa, else opx,
    /// else verbs, else tcp;ofi_rxm) and the interface
    /// from `FABRIC_IFACE`, else `nic_map` (or `DDSTORE_NIC_MAP`) at `local_rank`.
    pub fn from_env(
        config: &Config,
        nic_map: Option<&str>,
        local_rank: usize,
    ) -> FabricResult<OfiTransport> {
        Self::from_lookup(config, nic_map, local_rank, |k| std::env::var(k).ok())
    }

    /// As [`OfiTransport::from_env`] with the environment given by `get`
    /// (for the interface; provider and NIC map are the `config`'s).
    pub fn from_lookup(
        config: &Config,
        nic_map: Option<&str>,
        local_rank: usize,
        get: impl Fn(&str) -> Option<String>,
    ) -> FabricResult<OfiTransport> {
        // DDSTORE_* settings come from `config` (read once per store); the
        // interface variable (FABRIC_IFACE) from `get`.
        let candidates = select::provider_candidates(config.fabric.as_deref())?;
        let lookup = |k: &str| match k {
            "DDSTORE_NIC_MAP" => config.nic_map.clone(),
            _ => get(k),
        };
        let iface = select::interface(&lookup, nic_map, local_rank)?;
        let mut failures = Vec::new();
        for provider in &candidates {
            match Self::with_provider(config, provider, iface.as_deref()) {
                Ok(t) => return Ok(t),
                Err(e) => failures.push(format!("{provider}: {e}")),
            }
        }
        Err(FabricError::Unavailable(format!(
            "no usable libfabric provider (DDSTORE_FABRIC accepts {}; `python -m pyddstore info` \
             lists the providers with one-sided reads here): {}",
            select::FABRIC_VALUES,
            failures.join("; ")
        )))
    }

    /// A transport on `provider` (a libfabric name such as "tcp;ofi_rxm"),
    /// optionally on interface or NIC `iface`.
    pub fn with_provider(
        config: &Config,
        provider: &str,
        iface: Option<&str>,
    ) -> FabricResult<OfiTransport> {
        let mut request = select::request(provider, iface)?;
        let mut info = Info::query(&request)?;
        let provider = info.first().provider();
        let want = match config.remote_gather {
            RemoteGather::Off => false,
            RemoteGather::On => true,
            RemoteGather::Auto => gather_by_default(&provider),
        };
        let mut gather = false;
        if want {
            let mut tagged = InfoRequest {
                tagged: true,
                directed: true,
                provider: Some(provider.clone()),
                ..request.clone()
            };
            // Directed receives where the provider has them (tcp;ofi_rxm,
            // sockets do), else replies are bound by their nonce alone.
            let queried = Info::query(&tagged).or_else(|_| {
                tagged.directed = false;
                Info::query(&tagged)
            });
            // Our sends and receives pass no descriptors: providers that
            // need registered local buffers keep one-sided reads.
            let usable = queried.and_then(|i| {
                if i.first().cq_data_size() < super::gather::wire::REPLY_DATA_BYTES {
                    Err(FabricError::Unavailable(
                        "its messages carry no 8 bytes of remote CQ data (each reply's nonce \
                         travels in them)"
                            .into(),
                    ))
                } else if i.first().mr_mode() & sys::FI_MR_LOCAL as u64 != 0 {
                    Err(FabricError::Unavailable(
                        "it requires registered local buffers (FI_MR_LOCAL)".into(),
                    ))
                } else {
                    Ok(i)
                }
            });
            match usable {
                Ok(i) => {
                    info = i;
                    request = tagged;
                    gather = true;
                }
                Err(e) if config.remote_gather == RemoteGather::On => {
                    return Err(FabricError::Unavailable(format!(
                        "DDSTORE_REMOTE_GATHER=1 but provider {provider} cannot serve the \
                         gather path: {e}; use DDSTORE_REMOTE_GATHER=auto or 0"
                    )))
                }
                Err(_) => {}
            }
        }
        Ok(OfiTransport {
            config: config.clone(),
            provider,
            request,
            info,
            node: Mutex::new(None),
            gather,
            hmem_node: Mutex::new(None),
            child_readers: Arc::new(Mutex::new(None)),
            access: Arc::new(Access::default()),
            secret: Mutex::new(None),
            addrs: Mutex::new(None),
        })
    }

    /// The provider chosen, as libfabric names it (e.g. "tcp;ofi_rxm").
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// Whether remote batches go through the owner-side gather path.
    pub fn remote_gather(&self) -> bool {
        self.gather
    }

    fn node(&self) -> FabricResult<Arc<Node>> {
        let mut node = self.node.lock().unwrap_or_else(|p| p.into_inner());
        match node.as_ref() {
            Some(n) if n.domain.usable_here() => Ok(n.clone()),
            Some(_) => Err(FabricError::Unavailable(
                "a forked process cannot expose or attach shares (readers of shares the parent \
                 exposed or attached work): call expose/attach in the parent"
                    .into(),
            )),
            None => {
                let n = Arc::new(Node::open(
                    &self.info,
                    self.gather,
                    self.config.timeout,
                    self.config.gather_readers,
                    &self.access,
                    self.config.max_connections,
                )?);
                *node = Some(n.clone());
                Ok(n)
            }
        }
    }

    fn shares(
        &self,
        node: Arc<Node>,
        peers: Peers,
        exposed: Option<(MemoryRegion, Arc<dyn Memory>)>,
    ) -> OfiShares {
        // Our own share answers gather requests while these shares live.
        let served_key = match (&node.served, &exposed) {
            (Some(served), Some((mr, share))) => {
                served.add(mr.key(), share.clone());
                Some(mr.key())
            }
            _ => None,
        };
        OfiShares {
            mac_key: self.access.key(),
            discarded: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            served_key,
            _exposed: exposed,
            node,
            peers: Arc::new(peers),
            provider: self.provider.clone(),
            request: self.request.clone(),
            child_readers: self.child_readers.clone(),
            registry: Arc::new(DstRegistry::default()),
            config: self.config.clone(),
            gather: self.gather,
        }
    }

    /// Every rank's share from its record, the ranks' addresses in the
    /// table the store's variables share.
    fn decode_all(&self, records: &[Vec<u8>]) -> FabricResult<Peers> {
        let decoded = records
            .iter()
            .enumerate()
            .map(|(rank, raw)| {
                let rec = ShareRecord::decode(rank, raw)?;
                if rec.provider != self.provider {
                    return Err(FabricError::Unavailable(format!(
                        "rank {rank} exposed its share through provider {:?} but this process \
                         uses {:?}: set DDSTORE_FABRIC alike in every job",
                        rec.provider, self.provider
                    )));
                }
                Ok(rec)
            })
            .collect::<FabricResult<Vec<_>>>()?;
        let mut addrs = self.addrs.lock().unwrap_or_else(|p| p.into_inner());
        let peers = Peers::from_records(decoded, addrs.as_ref());
        *addrs = Some(peers.addrs.clone());
        Ok(peers)
    }

    /// Without a secret given (`set_secret`), the first exposure draws one
    /// on rank 0 and shares it over `comm` (method 1: the communicator is
    /// the job's own).
    fn agree_on_key(&self, comm: &Arc<dyn Comm>) -> FabricResult<()> {
        if !self.gather || self.access.key().is_some() {
            return Ok(());
        }
        let mut secret = [0u8; 32];
        getrandom::getrandom(&mut secret).map_err(|e| {
            FabricError::Unavailable(format!("the operating system gave no random bytes: {e}"))
        })?;
        let all = comm
            .allgather(&secret)
            .map_err(|e| FabricError::Invalid(format!("cannot share the job's key: {e}")))?;
        let first = all
            .first()
            .filter(|s| s.len() == secret.len())
            .ok_or_else(|| FabricError::Invalid("rank 0 sent no job key".into()))?;
        ddstore_core::transport::Transport::set_secret(self, first);
        Ok(())
    }

    /// Allocates and registers this rank's share (see `Transport::prepare`):
    /// `spilled` is the share's full length and how to wrap the region into
    /// it (a spilled share, see `Transport::expose_spilled`); remote readers
    /// then see the full length and the gather path serves all of it. The
    /// share answers gather requests from now on (a peer may ask as soon as
    /// the records are exchanged), until the shares returned are dropped.
    fn prepare_inner(
        &self,
        len: usize,
        opts: &ExposeOptions,
        spilled: Option<(usize, WrapShare<'_>)>,
    ) -> ddstore_core::Result<Prepared> {
        let node = self.node()?;
        let region = Arc::new(if opts.node_sharing {
            Region::shared_with(&opts.name, len, opts.keep_address)?
        } else {
            Region::anonymous_with(len, opts.keep_address)?
        });
        let locator = if opts.node_sharing {
            region.locator()
        } else {
            None
        };
        // SAFETY: the region (at least one page, even for len 0) stays mapped
        // while OfiShares holds it, and the MR is closed first.
        let mr = unsafe {
            MemoryRegion::register(
                &node.domain,
                &node.target,
                region.as_ptr(),
                len.max(1),
                sys::FI_REMOTE_READ as u64,
            )
        }?;
        let mut mine = ShareRecord::new(
            self.provider.clone(),
            node.target.name()?,
            region.as_ptr() as u64,
            mr.key(),
            spilled.map_or(len, |(full, _)| full) as u64,
        );
        mine.gather = node.served.is_some();
        if spilled.is_some() {
            mine.mem_len = Some(len as u64);
        }
        let local: Arc<dyn Memory> = match spilled {
            Some((_, wrap)) => wrap(region),
            None => region,
        };
        let shares = self.shares(node, Peers::default(), Some((mr, local.clone())));
        Ok(Prepared {
            local,
            locator,
            record: mine.encode(),
            state: Box::new(shares),
        })
    }

    /// Collective: as `prepare_inner`, then every rank's record and node
    /// locator in two allgathers (what `Transport::expose` does alone).
    fn expose_inner(
        &self,
        comm: &Arc<dyn Comm>,
        len: usize,
        opts: &ExposeOptions,
        spilled: Option<(usize, WrapShare<'_>)>,
    ) -> ddstore_core::Result<Exposed> {
        self.agree_on_key(comm)?;
        let prepared = self.prepare_inner(len, opts, spilled)?;
        let (node_peers, node_locators) = if opts.node_sharing {
            let shares = share_on_node_located(comm.as_ref(), prepared.locator.clone())?;
            (shares.views, shares.locators)
        } else {
            ((0..comm.size()).map(|_| None).collect(), Vec::new())
        };
        let records = comm.allgather(&prepared.record)?;
        let local = prepared.local.clone();
        let remote = self.connect(prepared, &records)?;
        Ok(Exposed {
            local,
            node_peers,
            remote,
            records,
            node_locators,
        })
    }
}

impl Transport for OfiTransport {
    fn name(&self) -> String {
        format!("ofi:{}", self.provider)
    }

    fn ready(&self, comm: &Arc<dyn Comm>) -> ddstore_core::Result<()> {
        Ok(self.agree_on_key(comm)?)
    }

    fn prepare(
        &self,
        _comm: &Arc<dyn Comm>,
        len: usize,
        opts: &ExposeOptions,
        spilled: Option<(usize, WrapShare<'_>)>,
    ) -> ddstore_core::Result<Option<Prepared>> {
        self.prepare_inner(len, opts, spilled).map(Some)
    }

    fn connect(
        &self,
        prepared: Prepared,
        records: &[Vec<u8>],
    ) -> ddstore_core::Result<Arc<dyn RemoteShares>> {
        let mut shares = prepared
            .state
            .downcast::<OfiShares>()
            .map_err(|_| FabricError::Invalid("a share prepared by another transport".into()))?;
        shares.peers = Arc::new(self.decode_all(records)?);
        Ok(Arc::new(*shares))
    }

    fn expose(
        &self,
        comm: &Arc<dyn Comm>,
        len: usize,
        opts: &ExposeOptions,
    ) -> ddstore_core::Result<Exposed> {
        self.expose_inner(comm, len, opts, None)
    }

    fn expose_spilled(
        &self,
        comm: &Arc<dyn Comm>,
        mem_len: usize,
        len: usize,
        opts: &ExposeOptions,
        wrap: WrapShare<'_>,
    ) -> ddstore_core::Result<Exposed> {
        self.expose_inner(comm, mem_len, opts, Some((len, wrap)))
    }

    fn expose_external(
        &self,
        comm: &Arc<dyn Comm>,
        share: ExternalShare,
        opts: &ExposeOptions,
    ) -> ddstore_core::Result<Exposed> {
        self.expose_hmem(comm, share, opts)
    }

    fn remote_path(&self) -> &'static str {
        if self.gather {
            "gather"
        } else {
            "one-sided"
        }
    }

    fn set_secret(&self, secret: &[u8]) {
        self.access.set_key(MacKey::derive(secret));
        *self.secret.lock().unwrap_or_else(|p| p.into_inner()) = Some(secret.to_vec());
    }

    fn secret(&self) -> Option<Vec<u8>> {
        self.secret
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn rejected_requests(&self) -> u64 {
        self.access
            .rejected_requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn attach(&self, records: &[Vec<u8>]) -> ddstore_core::Result<Arc<dyn RemoteShares>> {
        let peers = self.decode_all(records)?;
        let node = self.node()?;
        Ok(Arc::new(self.shares(node, peers, None)))
    }

    fn close(&self) -> ddstore_core::Result<()> {
        let node = close_node(&self.node);
        let hmem = close_node(&self.hmem_node);
        let child = self
            .child_readers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let child = child.map_or(Ok(()), |pool| close_last(pool, |pool| pool.close()));
        Ok(node.and(hmem).and(child)?)
    }
}

/// Every rank's share of one variable, readable through [`OfiReader`]s.
pub struct OfiShares {
    /// The key its readers MAC gather requests under.
    mac_key: Option<MacKey>,
    /// Replies its readers discarded.
    discarded: Arc<std::sync::atomic::AtomicU64>,
    /// Our share's key in the node's served table (removed on drop).
    served_key: Option<u64>,
    // Close order: our share's MR (then its memory), then the node.
    _exposed: Option<(MemoryRegion, Arc<dyn Memory>)>,
    node: Arc<Node>,
    peers: Arc<Peers>,
    /// The provider's name, for the records given back (`RemoteShares::records`).
    provider: String,
    request: InfoRequest,
    /// Reader endpoints opened in a forked child (the parent's are
    /// abandoned), shared with the transport's other variables.
    child_readers: Arc<Mutex<Option<Arc<EndpointPool>>>>,
    registry: Arc<DstRegistry>,
    config: Config,
    /// Readers use the gather path for owners whose record offers it.
    gather: bool,
}

impl OfiShares {
    /// The endpoints readers borrow: the node's, or in a forked child those
    /// of a fresh domain (opened once, on first use).
    fn reader_pool(&self) -> FabricResult<Arc<EndpointPool>> {
        if self.node.readers.domain().usable_here() {
            return Ok(self.node.readers.clone());
        }
        let mut child = self.child_readers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = child.as_ref().filter(|p| p.domain().usable_here()) {
            return Ok(p.clone());
        }
        let domain = open_domain(&Info::query(&self.request)?)?;
        let pool = EndpointPool::new(domain, self.config.max_connections);
        *child = Some(pool.clone());
        Ok(pool)
    }

    /// Per-rank share lengths, as exposed.
    pub fn share_lens(&self) -> Vec<u64> {
        self.peers.shares.iter().map(|p| p.len).collect()
    }
}

impl Drop for OfiShares {
    fn drop(&mut self) {
        // Refuse gather requests for this share from now on; replies in
        // flight keep its memory alive until they complete.
        if let (Some(key), Some(served)) = (self.served_key, &self.node.served) {
            served.remove(key);
        }
    }
}

impl RemoteShares for OfiShares {
    fn share_lens(&self) -> Option<Vec<u64>> {
        Some(OfiShares::share_lens(self))
    }

    fn max_read_len(&self) -> Option<usize> {
        Some(self.node.domain.info().max_msg_size().max(1))
    }

    fn open_reader(&self) -> ddstore_core::Result<Box<dyn ShareReader>> {
        let pool = self.reader_pool()?;
        let reader = OfiReader::open(
            &pool,
            self.peers.clone(),
            ReaderSettings {
                window: self.config.max_inflight,
                timeout: self.config.timeout,
                max_read_bytes: self.config.max_read_bytes,
                force_local_mr: self.config.ofi_local_mr,
                gather: self.gather && self.peers.shares.iter().any(|p| p.gather),
                // Only for the job's own shares: records an extra job or a
                // spawned worker read from files and handles keep the gather
                // path, whose owner refuses a key it never issued clearly.
                few_reads_one_sided: self.config.remote_gather == RemoteGather::Auto
                    && self.served_key.is_some(),
                mac_key: self.mac_key.clone(),
                discarded: self.discarded.clone(),
            },
        )?;
        Ok(Box::new(reader))
    }

    fn records(&self) -> Vec<Vec<u8>> {
        (0..self.peers.len())
            .map(|r| self.peers.record(&self.provider, r).encode())
            .collect()
    }

    fn gather_key(&self, owner: usize) -> Option<u64> {
        let peer = self.peers.get(owner)?;
        (self.gather && peer.gather).then_some(peer.key)
    }

    fn rejected_replies(&self) -> u64 {
        self.discarded.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn register_dst(&self, addr: usize, len: usize) -> ddstore_core::Result<()> {
        Ok(self.registry.register(addr, len)?)
    }

    fn close(self: Arc<Self>) -> ddstore_core::Result<()> {
        let Some(mut shares) = Arc::into_inner(self) else {
            return Ok(());
        };
        // As on drop: gather requests for this share are refused from now on.
        if let (Some(key), Some(served)) = (shares.served_key, &shares.node.served) {
            served.remove(key);
        }
        let exposed = shares._exposed.take();
        Ok(exposed.map_or(Ok(()), |(mr, _memory)| mr.close())?)
    }

    fn unregister_dst(&self, addr: usize, len: usize) -> ddstore_core::Result<()> {
        Ok(self.registry.unregister(addr, len)?)
    }

    fn forget_after_fork(&self) -> ddstore_core::Result<()> {
        // Inherited objects are abandoned by their Drop (they record the pid
        // that opened them); drop any child domain of an earlier generation.
        let mut child = self.child_readers.lock().unwrap_or_else(|p| p.into_inner());
        if child.as_ref().is_some_and(|p| !p.domain().usable_here()) {
            *child = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_have_a_domain_of_their_own_where_progress_is_manual() {
        // tcp;ofi_rxm (manual progress): the readers' endpoints and the
        // gather server's progress thread never share a domain's progress.
        let request = InfoRequest {
            provider: Some("tcp;ofi_rxm".into()),
            node: Some("127.0.0.1".into()),
            tagged: true,
            ..Default::default()
        };
        let info = Info::query(&request).expect("tcp;ofi_rxm on loopback");
        let timeout = std::time::Duration::from_secs(5);
        let node = Node::open(&info, true, timeout, 64, &Arc::default(), 1024).expect("a node");
        assert!(node.domain.info().manual_data_progress());
        assert!(!Arc::ptr_eq(node.readers.domain(), &node.domain));
        assert!(Arc::ptr_eq(
            node.readers.domain().fabric(),
            node.domain.fabric()
        ));
        node.close().unwrap();
    }
}
