//! The owner's reader index: the AV address (one entry, and over
//! connection-oriented providers one connection) of each authenticated
//! reply name. At most the reader cap (`DDSTORE_GATHER_READERS`) are served
//! at once; a reader past it gets a route kept only to answer "busy" (at
//! most [`BUSY_ROUTES`] of those), and retries; idle routes make room
//! (forgotten, their AV entries and connections kept).

use libfabric_sys as sys;

use super::{Server, BUSY_ROUTES};

/// Where an authenticated request's replies can go.
pub(super) enum Route {
    /// A reader being served.
    Serve(sys::fi_addr_t),
    /// A reader past the cap: it is answered "busy" and retries.
    Busy(sys::fi_addr_t),
    /// Not an endpoint name of this provider (or the AV refused it).
    Unroutable,
    /// No route is free now, not even to say "busy": the request waits.
    Full,
}

impl Server {
    /// The route of an authenticated reader name, inserted on first use.
    pub(super) fn route(&mut self, name: &[u8]) -> Route {
        if let Some(&a) = self.routes.get(name) {
            if !self.busy_routes.contains(&a) {
                return Route::Serve(a);
            }
            if self.serving_room() {
                // A place freed up: the reader is served from now on.
                self.busy_routes.remove(&a);
                return Route::Serve(a);
            }
            return Route::Busy(a);
        }
        if !self.plausible_name(name) {
            return Route::Unroutable;
        }
        let busy = !self.serving_room();
        if busy && self.busy_routes.len() >= BUSY_ROUTES && !self.forget_idle(true, 1) {
            return Route::Full;
        }
        let Some(addr) = self
            .ep
            .av()
            .insert(&[name], self.name.len())
            .ok()
            .and_then(|a| a.first().copied())
        else {
            return Route::Unroutable;
        };
        self.routes.insert(name.to_vec(), addr);
        if busy {
            self.busy_routes.insert(addr);
            Route::Busy(addr)
        } else {
            Route::Serve(addr)
        }
    }

    /// Whether one more reader may be served, forgetting idle ones to make room.
    fn serving_room(&mut self) -> bool {
        let serving = |s: &Server| s.routes.len() - s.busy_routes.len();
        serving(self) < self.max_readers
            || (self.forget_idle(false, usize::MAX) && serving(self) < self.max_readers)
    }

    /// Forgets up to `n` routes with nothing queued or in flight, among the
    /// busy-only ones or the served ones. Their AV entries stay (inserting
    /// the name again finds the same address): removing one would, with
    /// `FI_AV_REMOVE_CLEANUP`, close a connection the reader may be reading
    /// over one-sided or sending its next request on, and that request went
    /// unanswered. The reader's own bounded set closes idle connections.
    /// Whether one was forgotten.
    fn forget_idle(&mut self, busy_only: bool, n: usize) -> bool {
        let idle: Vec<(Vec<u8>, sys::fi_addr_t)> = self
            .routes
            .iter()
            .filter(|(_, a)| self.busy_routes.contains(a) == busy_only)
            .filter(|(_, a)| {
                self.peers
                    .get(a)
                    .is_none_or(|p| p.in_flight == 0 && p.backlog.is_empty())
            })
            .take(n)
            .map(|(name, a)| (name.clone(), *a))
            .collect();
        for (name, a) in &idle {
            self.routes.remove(name);
            self.busy_routes.remove(a);
            self.peers.remove(a);
        }
        !idle.is_empty()
    }

    /// Whether `name` (from an authenticated request) looks like an
    /// endpoint name of this provider: no longer than ours and, for socket
    /// addresses, of our address family and length.
    fn plausible_name(&self, name: &[u8]) -> bool {
        let family = |n: &[u8]| n.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]]));
        let own = family(&self.name);
        let inet = [libc::AF_INET as u16, libc::AF_INET6 as u16];
        match own {
            Some(f) if inet.contains(&f) => {
                name.len() == self.name.len() && family(name) == Some(f)
            }
            _ => !name.is_empty() && name.len() <= self.name.len(),
        }
    }
}
