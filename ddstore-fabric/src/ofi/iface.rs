//! The IPv4 address of a network interface, for socket-based providers
//! (tcp, sockets) that bind to an address rather than a NIC name.

use std::ffi::CStr;
use std::net::Ipv4Addr;

/// The first IPv4 address of interface `name` (e.g. "lo" -> 127.0.0.1).
pub fn ipv4_of(name: &str) -> Option<Ipv4Addr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills head with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is an element of the list getifaddrs returned; ifa_name is
        // NUL-terminated and ifa_addr, when non-null and AF_INET, is a sockaddr_in.
        unsafe {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || (*ifa.ifa_addr).sa_family as i32 != libc::AF_INET {
                continue;
            }
            if CStr::from_ptr(ifa.ifa_name).to_bytes() != name.as_bytes() {
                continue;
            }
            let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
            found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            break;
        }
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}
